//! Python bindings for the align-mode Mamba prefill-checkpoint rules of
//! `crate::attention::mamba`, which the simulator's chunk split (`kvblocks.sim.mamba_split`)
//! reads as vLLM's scheduler does.

use std::num::NonZeroUsize;

use pyo3::prelude::*;

use crate::attention::mamba;

/// vLLM's `get_mamba_prefill_checkpoint_position`: the reusable state boundary of a
/// prefill of `num_tokens` tokens.
#[pyfunction]
fn mamba_checkpoint_position(
    num_tokens: usize,
    alignment: NonZeroUsize,
    drop_eagle: bool,
    hash_lookahead_tokens: usize,
) -> usize {
    mamba::checkpoint_position(
        num_tokens,
        alignment.get(),
        drop_eagle,
        hash_lookahead_tokens,
    )
}

/// vLLM's `is_mamba_prefill_checkpoint_valid`: whether the kernel can export the state at
/// `position` from a query `[start, end)`.
#[pyfunction]
fn mamba_checkpoint_exportable(
    start: usize,
    end: usize,
    position: usize,
    hash_block_size: NonZeroUsize,
    block_size: NonZeroUsize,
    alignment: NonZeroUsize,
) -> bool {
    mamba::checkpoint_exportable(
        start,
        end,
        position,
        hash_block_size.get(),
        block_size.get(),
        alignment.get(),
    )
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(mamba_checkpoint_position, m)?)?;
    m.add_function(wrap_pyfunction!(mamba_checkpoint_exportable, m)?)?;
    Ok(())
}
