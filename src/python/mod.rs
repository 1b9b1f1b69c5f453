//! PyO3 bindings, compiled only with the `python` feature. Conversion only: every rule of
//! behaviour lives in the core. Each submodule exposes `register(module)`.

use pyo3::prelude::*;

mod ceilings;
mod config;
mod device_ids;
mod errors;
mod events;
mod hashing;
mod ids;
mod mamba;
mod manager;
mod non_negative;
mod offload;
mod pool;
mod publish;
mod request;
mod request_hasher;
mod retention;
mod router;
mod spec;
mod stats;
mod vllm_reads;
mod vllm_request;

/// The `kvblocks._core` extension module.
#[pymodule(gil_used = false)]
#[pyo3(name = "_core")]
fn kvblocks_core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    errors::register(m)?;
    ceilings::register(m)?;
    mamba::register(m)?;
    events::register(m)?;
    hashing::register(m)?;
    pool::register(m)?;
    publish::register(m)?;
    spec::register(m)?;
    config::register(m)?;
    device_ids::register(m)?;
    manager::register(m)?;
    offload::register(m)?;
    stats::register(m)?;
    request::register(m)?;
    request_hasher::register(m)?;
    retention::register(m)?;
    router::register(m)?;
    vllm_reads::register(m)?;
    Ok(())
}
