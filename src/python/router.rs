//! `KVIndex` and `EngineHit`: the router index (`crate::router`) for Python. Conversion
//! only; queries and ingests release the GIL.

use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::PyDict;

use super::config::PyKVCacheConfig;
use super::hashing::{extract_token_ids, parse_algo};
use super::request::mm_features;
use crate::attention::{ContextParallel, ManagerParams};
use crate::hashing::LoraRequest;
use crate::request::RequestOptions;
use crate::router::{EngineConfig, EngineHit, KvIndex};
use crate::types::BlockHash;

/// One engine's hit for a request.
#[pyclass(name = "EngineHit", module = "kvblocks._core", frozen, get_all)]
pub(crate) struct PyEngineHit {
    engine: String,
    gpu_tokens: usize,
    gpu_blocks: usize,
    host_tokens: usize,
    host_blocks: usize,
    block_size: usize,
    freshness: &'static str,
}

#[pymethods]
impl PyEngineHit {
    fn __repr__(&self) -> String {
        format!(
            "EngineHit(engine={:?}, gpu_tokens={}, host_tokens={}, freshness={:?})",
            self.engine, self.gpu_tokens, self.host_tokens, self.freshness
        )
    }
}

impl From<EngineHit> for PyEngineHit {
    fn from(h: EngineHit) -> Self {
        Self {
            engine: h.engine.to_string(),
            gpu_tokens: h.gpu_tokens,
            gpu_blocks: h.gpu_blocks(),
            host_tokens: h.host_tokens,
            host_blocks: h.host_blocks(),
            block_size: h.block_size,
            freshness: h.freshness.name(),
        }
    }
}

/// The router index of a fleet's KV caches (`kvblocks.router.KVIndex`).
#[pyclass(name = "KVIndex", module = "kvblocks._core", frozen)]
pub(crate) struct PyKVIndex {
    inner: KvIndex,
}

/// kvblocks' `KVCacheConfig`, or vLLM's converted by `kvblocks.vllm` (which reads its
/// attributes; vLLM itself is not imported).
fn kvblocks_config<'py>(config: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyKVCacheConfig>> {
    if let Ok(ours) = config.downcast::<PyKVCacheConfig>() {
        return Ok(ours.clone());
    }
    let convert = config
        .py()
        .import("kvblocks.vllm._config")?
        .getattr("convert_config")?;
    Ok(convert
        .call1((config,))?
        .downcast_into::<PyKVCacheConfig>()?)
}

fn engine_list(engines: &Option<Vec<String>>) -> Option<Vec<&str>> {
    engines
        .as_ref()
        .map(|ids| ids.iter().map(String::as_str).collect())
}

fn hit_dict(py: Python<'_>, hits: Vec<EngineHit>) -> PyResult<Bound<'_, PyDict>> {
    let out = PyDict::new(py);
    for h in hits {
        out.set_item(h.engine.to_string(), PyEngineHit::from(h))?;
    }
    Ok(out)
}

#[pymethods]
impl PyKVIndex {
    #[new]
    fn new() -> Self {
        Self {
            inner: KvIndex::new(),
        }
    }

    #[pyo3(signature = (engine_id, kv_cache_config, *, max_model_len, hash_block_size,
                        hash_algo="sha256_cbor", python_hash_seed=None,
                        data_parallel_rank=None, host_tier=false, host_block_size=None,
                        started_empty=false,
                        scheduler_block_size=None, enable_caching=true, use_eagle=false,
                        dcp_world_size=1, pcp_world_size=1, mamba_none_prefix_caching=false,
                        num_hash_lookahead_tokens=0))]
    #[allow(clippy::too_many_arguments)]
    fn add_engine(
        &self,
        engine_id: &str,
        kv_cache_config: &Bound<'_, PyAny>,
        max_model_len: usize,
        hash_block_size: usize,
        hash_algo: &str,
        python_hash_seed: Option<String>,
        data_parallel_rank: Option<i64>,
        host_tier: bool,
        host_block_size: Option<usize>,
        started_empty: bool,
        scheduler_block_size: Option<usize>,
        enable_caching: bool,
        use_eagle: bool,
        dcp_world_size: usize,
        pcp_world_size: usize,
        mamba_none_prefix_caching: bool,
        num_hash_lookahead_tokens: usize,
    ) -> PyResult<()> {
        let layout = kvblocks_config(kv_cache_config)?;
        let mut config = EngineConfig::new(
            ManagerParams::from_config(&layout.borrow().inner)?,
            max_model_len,
            hash_block_size,
        );
        config.hash_algo = parse_algo(hash_algo)?;
        config.python_hash_seed = python_hash_seed;
        config.data_parallel_rank = data_parallel_rank;
        config.host_tier = host_tier;
        config.host_block_size = host_block_size;
        config.started_empty = started_empty;
        let o = &mut config.options;
        o.scheduler_block_size = scheduler_block_size;
        o.enable_caching = enable_caching;
        o.use_eagle = use_eagle;
        o.context_parallel = ContextParallel::new(dcp_world_size, pcp_world_size)?;
        o.mamba_none_prefix_caching = mamba_none_prefix_caching;
        o.num_hash_lookahead_tokens = num_hash_lookahead_tokens;
        Ok(self.inner.add_engine(engine_id, config)?)
    }

    fn remove_engine(&self, engine_id: &str) -> PyResult<()> {
        Ok(self.inner.remove_engine(engine_id)?)
    }

    fn engines(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.inner.engines().iter().map(|s| s.to_string()).collect();
        ids.sort();
        ids
    }

    #[pyo3(signature = (engine_id, payload, seq=None))]
    fn ingest(
        &self,
        py: Python<'_>,
        engine_id: &str,
        payload: PyBackedBytes,
        seq: Option<u64>,
    ) -> PyResult<(usize, &'static str)> {
        let r = py.allow_threads(|| self.inner.ingest(engine_id, seq, &payload))?;
        Ok((r.batches_applied, r.freshness.name()))
    }

    fn skip_gap(&self, engine_id: &str) -> PyResult<&'static str> {
        Ok(self.inner.skip_gap(engine_id)?.name())
    }

    fn reset_engine(&self, engine_id: &str) -> PyResult<&'static str> {
        Ok(self.inner.reset_engine(engine_id)?.name())
    }

    fn status<'py>(&self, py: Python<'py>, engine_id: &str) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.status(engine_id)?;
        let d = PyDict::new(py);
        d.set_item("freshness", s.freshness.name())?;
        d.set_item("last_seq", s.last_seq)?;
        d.set_item("batches", s.batches)?;
        d.set_item("events", s.events)?;
        d.set_item("duplicates", s.duplicates)?;
        d.set_item("gaps", s.gaps)?;
        d.set_item("resets", s.resets)?;
        d.set_item("held", s.held)?;
        d.set_item("hash_checks", s.hash_checks)?;
        d.set_item("hash_mismatches", s.hash_mismatches)?;
        d.set_item("blocks", s.blocks)?;
        d.set_item("data_parallel_rank", s.data_parallel_rank)?;
        Ok(d)
    }

    fn memory(&self) -> PyResult<(usize, usize)> {
        Ok(self.inner.memory()?)
    }

    #[pyo3(signature = (tokens, *, cache_salt=None, lora_name=None, lora_path=None,
                        mm_features=None, engines=None))]
    #[allow(clippy::too_many_arguments)]
    fn hits<'py>(
        &self,
        py: Python<'py>,
        tokens: &Bound<'py, PyAny>,
        cache_salt: Option<String>,
        lora_name: Option<String>,
        lora_path: Option<String>,
        mm_features: Option<Vec<(String, i64, i64)>>,
        engines: Option<Vec<String>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let tokens = extract_token_ids(tokens)?;
        let options = RequestOptions {
            lora: LoraRequest::from_parts(lora_name, lora_path, None)?,
            cache_salt,
            mm_features: self::mm_features(mm_features.unwrap_or_default())?,
            prompt_embeds: None,
        };
        let ids = engine_list(&engines);
        let hits = py.allow_threads(|| self.inner.hits(&tokens, &options, ids.as_deref()))?;
        hit_dict(py, hits)
    }

    #[pyo3(signature = (block_hashes, num_tokens, *, engines=None))]
    fn hits_from_hashes<'py>(
        &self,
        py: Python<'py>,
        block_hashes: Vec<PyBackedBytes>,
        num_tokens: usize,
        engines: Option<Vec<String>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let hashes = block_hashes
            .iter()
            .map(|h| BlockHash::from_slice(h))
            .collect::<crate::Result<Vec<_>>>()?;
        let ids = engine_list(&engines);
        let hits = py.allow_threads(|| {
            self.inner
                .hits_from_hashes(&hashes, num_tokens, ids.as_deref())
        })?;
        hit_dict(py, hits)
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyKVIndex>()?;
    m.add_class::<PyEngineHit>()?;
    Ok(())
}
