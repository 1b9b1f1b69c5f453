//! KV cache events: the events the block pool records ([`event`], vLLM 0.33.0's fields),
//! and their way to routers: vLLM 0.33.0's msgpack encodings
//! ([`encode_batch`]), the scheduler-to-network hand-off ([`EventSink`], lock-free, bounded,
//! drop-oldest), the network side's numbering and encoding ([`PayloadEncoder`]) and the
//! cache mirror that snapshots are built from ([`CacheIndex`]).
//!
//! The transport (ZMQ PUB + ROUTER replay, as vLLM's `ZmqEventPublisher`) lives in Python
//! (`kvblocks.events`); everything per event happens here, without the GIL.

pub mod encode;
pub mod event;
pub mod handoff;
pub mod index;
pub mod msgpack;

pub use encode::{encode_batch, encode_batch_into, WireFormat};
pub use handoff::{EncoderStats, EventBatch, EventSink, PayloadEncoder, SinkStats, Work};
pub use index::CacheIndex;
