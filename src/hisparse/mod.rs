//! HiSparse's coordinator (vLLM 0.33's `vllm.v1.hisparse.coordinator.HiSparseCoordinator`):
//! the residency state machine over the host tier (`crate::host_tier`) and the resident
//! and hot groups (`crate::attention::hisparse_resident`, `hisparse_hot`). Built piece by
//! piece (docs/hisparse-plan.md, section 8); so far the page-transfer ledger
//! ([`spills`]), a request's residency state with the write-back planner ([`state`]) and
//! the deferred publication's copy of the request ([`publication`]).

pub mod publication;
pub mod spills;
pub mod state;
