"""Run vLLM 0.33.0's own scheduler and request hashing on the kvblocks core.

`import kvblocks.vllm` imports no vLLM; the names below load it on first use.

    import kvblocks.vllm
    kvblocks.vllm.install()     # from here on vLLM's Scheduler builds kvblocks' manager

or, for a deployment without code, `KVBLOCKS_VLLM=1` in the environment of every vLLM
process (the `vllm.general_plugins` entry point calls `install()`).
"""
