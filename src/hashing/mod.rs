//! Prefix block hashing, bit-identical to vLLM 0.33.0 (section 2 of the semantics reference).
