#!/usr/bin/env python3
"""Replay a kvtrace-v1 trace through vLLM's real KVCacheManager and time it.

Usage:
    $VREF/bin/python driver_vllm.py TRACE.jsonl [--config full|hybrid]
        [--num-blocks 32768] [--sliding-window 1024] [--block-size 16]
        [--max-num-batched-tokens 8192] [--max-num-seqs 256]
        [--hash-algo sha256] [--events-out EVENTS.txt] [--label NAME]
    e.g.  .venv-vllm-0.33/bin/python tools/oracle/driver_vllm.py traces/shared-prefix.jsonl --num-blocks 32768
          .venv-vllm-0.33/bin/python tools/oracle/driver_vllm.py traces/long-context.jsonl --config hybrid --sliding-window 4096

Prints ONE JSON summary line on stdout (progress/errors go to stderr). VREF is
a vLLM venv made by tools/vllm_env/setup.sh (.venv-vllm-0.33 or .venv-vllm-0.32). Traces come from trace.py.

What is measured
----------------
Only calls into the KV cache manager are timed (time.perf_counter_ns() around
each call; `timer_overhead_ns` is the cost of one empty timing pair):
    get_computed_blocks      KVCacheManager.get_computed_blocks(req)
    alloc_admit              allocate_slots() that admits a waiting request
                             (prefix-hit blocks passed in, full_sequence_must_fit)
    alloc_prefill_chunk      allocate_slots() for a later prefill chunk
    alloc_decode             allocate_slots(req, 1) after a token was appended
    alloc_failed             any allocate_slots() that returned None (the three
                             types above count successful calls only)
    free                     KVCacheManager.free(req) (finish or preemption)
    new_step_starts          KVCacheManager.new_step_starts(), once per step
"alloc_prefill" in the summary = alloc_admit + alloc_prefill_chunk. Block hashing
is not a manager call in vLLM (it runs inside Request(...) and
Request.append_output_token_ids); it is timed separately as `request_hash_ns`.

Scheduler (a faithful subset of vllm.v1.core.sched.scheduler.Scheduler.schedule
with sync scheduling, FCFS, no spec decode/connectors/encoders, watermark 0,
long_prefill_token_threshold 0, scheduler_reserve_full_isl as --reserve-full-isl)
----------------------------------------------------------------------------
Each executed step s (steps with nothing running or waiting are skipped):
 0. Arrivals: trace requests whose arrival step <= s are appended to `waiting`
    in (arrival step, trace order) order; the vLLM Request (with block hasher)
    is constructed at that moment. A record with "after" = R arrives at
    finish_step(R) + arrival_step.
 1. new_step_starts(); budget = --max-num-batched-tokens.
 2. Running loop, i over `running` in order while budget > 0:
      n = min(req.num_tokens - req.num_computed_tokens, budget)
      loop: r = allocate_slots(req, n); if r is not None: break
            victim = running.pop()              # the most recently admitted
            free(victim); victim: status PREEMPTED, num_computed_tokens = 0,
            prepended to `waiting`; if victim is req: break
      if r is None: stop the running loop; else budget -= n, schedule (req, n).
 3. Only if step 2 preempted nothing: waiting loop while budget > 0 and waiting
    and len(running) < --max-num-seqs:
      req = waiting[0]; blocks, hit = get_computed_blocks(req)
      n = min(req.num_tokens - hit, budget)
      r = allocate_slots(req, n, hit, blocks, full_sequence_must_fit=F,
                         has_scheduled_reqs=bool(running))
      if r is None: stop; else pop it, append to running, status RUNNING,
      num_computed_tokens = hit, budget -= n, schedule (req, n).
 4. Model step, scheduled requests in schedule order: num_computed_tokens += n;
    if num_computed_tokens == num_tokens the request samples output token
    k = num_output_tokens: tok(out_seed, k) (see trace.py) and appends it; when
    num_output_tokens == max_output_tokens it finishes and is freed at once.
    Finished requests leave `running` (order of the rest kept).
Prefix-cache stats follow vLLM's PrefixCacheStats: queried = req.num_tokens and
hit = get_computed_blocks' token count, recorded when a request is admitted
(first admissions and re-admissions after preemption reported separately).

Allocation digest (for bit-identical comparison with another implementation)
----------------------------------------------------------------------------
`digest` = sha256 over these ASCII lines, in call order. Fields are separated
by one space and each line ends in "\\n". IDS is one list per KV cache group,
groups joined by ";", block ids in table order joined by "," (e.g. "3,4,5;0,0,9";
an empty IDS still leaves its separating space: "G sp-000000 0 \\n").
    G <rid> <hit_tokens> <IDS>         get_computed_blocks: hit blocks (null block
                                       0 for skipped sliding-window blocks)
    A <rid> <n> <hit_tokens> <IDS|->   allocate_slots: the newly allocated blocks
                                       it returned, "-" for None; <hit_tokens> is
                                       the prefix hit passed in (0 unless admission)
    P <rid> <IDS>                      preemption victim's full block table, taken
                                       right before its free (after the failed A)
    F <rid> <IDS>                      finished request's full block table, taken
                                       right before its free
    S <step> <num_free_blocks>         end of every executed step
The digest does not depend on the block-hash function or PYTHONHASHSEED (checked:
sha256, sha256_cbor and PYTHONHASHSEED=123 give the same digest), only on block
allocation. --events-out writes the same lines to a file for diffing.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import platform
import sys
import time
from array import array
from collections import deque

HERE = os.path.dirname(os.path.abspath(__file__))
# The sibling trace.py would shadow the stdlib module 'trace' for everything
# imported later, so drop this directory from sys.path and load it as 'kvtrace'.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]


def _load_kvtrace():
    import importlib.util

    spec = importlib.util.spec_from_file_location("kvtrace", os.path.join(HERE, "trace.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules["kvtrace"] = mod
    spec.loader.exec_module(mod)
    return mod


kvtrace = _load_kvtrace()

CALL_TYPES = (
    "get_computed_blocks",
    "alloc_admit",
    "alloc_prefill_chunk",
    "alloc_decode",
    "alloc_failed",
    "free",
    "new_step_starts",
)


def build_kv_cache_config(args):
    import torch
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        SlidingWindowSpec,
    )

    common = dict(block_size=args.block_size, num_kv_heads=8, head_size=128, dtype=torch.bfloat16)
    groups = [KVCacheGroupSpec(["model.layers.0.self_attn"], FullAttentionSpec(**common))]
    if args.config == "hybrid":
        groups.append(
            KVCacheGroupSpec(
                ["model.layers.1.self_attn"],
                SlidingWindowSpec(sliding_window=args.sliding_window, **common),
            )
        )
    return KVCacheConfig(num_blocks=args.num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)


def build_vllm_manager(args, kv_cache_config):
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    return KVCacheManager(
        kv_cache_config=kv_cache_config,
        max_model_len=args.max_model_len,
        scheduler_block_size=args.block_size,
        hash_block_size=args.block_size,
        max_in_flight_tokens=args.max_num_batched_tokens,  # sync: 1 batch in flight
        enable_caching=not args.no_prefix_caching,
        log_stats=False,
    )


def ids_str(block_ids) -> str:
    """Canonical text of a per-group block-id table (tuple of lists)."""
    return ";".join(",".join(map(str, g)) for g in block_ids)


def timer_overhead_ns(n: int = 200000) -> int:
    """Best-of-5 cost of one `t0 = pc(); ...; pc() - t0` pair (plus loop step)."""
    pc = time.perf_counter_ns
    best = None
    for _ in range(5):
        t0 = pc()
        for _ in range(n):
            a = pc()
            _ = pc() - a
        per = (pc() - t0) / n
        best = per if best is None else min(best, per)
    return int(round(best))


def pct(sorted_vals, q):
    if not sorted_vals:
        return 0
    k = min(len(sorted_vals) - 1, max(0, int(round(q * (len(sorted_vals) - 1)))))
    return sorted_vals[k]


class Driver:
    def __init__(self, args, header, records, manager):
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.request import Request, RequestStatus

        self.args = args
        self.header = header
        self.records = records
        self.km = manager
        self.vocab = header.get("vocab_size", kvtrace.VOCAB_SIZE)
        self.Request = Request
        self.RS = RequestStatus
        self.SamplingParams = SamplingParams
        hash_fn = get_hash_fn_by_name(args.hash_algo)
        init_none_hash(hash_fn)
        self.block_hasher = get_request_block_hasher(args.block_size, hash_fn)

        # timing
        self.samples = {t: array("q") for t in CALL_TYPES}
        self.hash_ns = 0
        self.request_init_ns = 0
        self.append_ns = 0
        # counters
        self.alloc_failures = 0
        self.preemptions = 0
        self.steps = 0
        self.generated_tokens = 0
        self.pc_first = [0, 0, 0]  # admissions, queried, hit
        self.pc_resumed = [0, 0, 0]
        # digest
        self.digest = hashlib.sha256() if not args.no_digest else None
        self.events_f = open(args.events_out, "w") if args.events_out else None
        self.num_events = 0

    # ---------------------------------------------------------------- events
    def ev(self, line: str) -> None:
        self.num_events += 1
        if self.digest is not None:
            self.digest.update(line.encode())
        if self.events_f is not None:
            self.events_f.write(line)

    # --------------------------------------------------------------- helpers
    def make_request(self, rec):
        prompt = kvtrace.record_prompt_ids(rec, self.vocab)
        sp = self.SamplingParams(max_tokens=rec["max_output_tokens"])
        pc = time.perf_counter_ns
        t0 = pc()
        req = self.Request(
            request_id=rec["request_id"],
            prompt_token_ids=prompt,
            sampling_params=sp,
            pooling_params=None,
            arrival_time=0.0,
            block_hasher=self.block_hasher,
        )
        self.request_init_ns += pc() - t0
        req._kv_out_seed = rec["out_seed"]
        req._kv_out_base = kvtrace.splitmix64(rec["out_seed"])
        req._kv_prefill_done = False
        return req

    def next_output_token(self, req) -> int:
        k = req.num_output_tokens
        return kvtrace.splitmix64((req._kv_out_base + k) & kvtrace.MASK64) % self.vocab

    # ------------------------------------------------------------------- run
    def run(self) -> dict:
        args, km = self.args, self.km
        pc = time.perf_counter_ns
        S = self.samples
        s_gcb, s_admit, s_chunk = S["get_computed_blocks"], S["alloc_admit"], S["alloc_prefill_chunk"]
        s_dec, s_free, s_nss = S["alloc_decode"], S["free"], S["new_step_starts"]
        s_fail = S["alloc_failed"]
        RS = self.RS
        ev = self.ev
        budget0 = args.max_num_batched_tokens
        digest_on = self.digest is not None or self.events_f is not None
        block_pool = getattr(km, "block_pool", None)

        # arrival bookkeeping
        import heapq

        followers: dict[str, list[int]] = {}
        pending: list[tuple[int, int]] = []  # (arrival_step, trace index)
        for idx, rec in enumerate(self.records):
            if rec.get("after"):
                followers.setdefault(rec["after"], []).append(idx)
            else:
                pending.append((rec["arrival_step"], idx))
        heapq.heapify(pending)
        waiting: deque = deque()
        running: list = []
        n_total = len(self.records)
        n_finished = 0
        step = 0
        self.finish_step: dict[str, int] = {}

        t_wall0 = time.perf_counter()
        while n_finished < n_total:
            # 0. arrivals (skip idle steps)
            if not running and not waiting:
                if not pending:
                    raise RuntimeError("no runnable requests left but trace not finished")
                step = max(step, pending[0][0])
            while pending and pending[0][0] <= step:
                _, idx = heapq.heappop(pending)
                waiting.append(self.make_request(self.records[idx]))
            if args.max_steps and self.steps >= args.max_steps:
                raise RuntimeError(f"--max-steps {args.max_steps} reached")

            # 1. step start
            t0 = pc()
            km.new_step_starts()
            s_nss.append(pc() - t0)
            budget = budget0
            scheduled = []  # (req, n)
            preempted_any = False

            # 2. running loop
            i = 0
            while i < len(running) and budget > 0:
                req = running[i]
                n = req.num_tokens - req.num_computed_tokens
                if n > budget:
                    n = budget
                is_dec = req._kv_prefill_done
                samp = s_dec if is_dec else s_chunk
                while True:
                    t0 = pc()
                    r = km.allocate_slots(req, n)
                    dt = pc() - t0
                    (samp if r is not None else s_fail).append(dt)
                    if digest_on:
                        ev(f"A {req.request_id} {n} 0 {'-' if r is None else ids_str(r.get_block_ids())}\n")
                    if r is not None:
                        break
                    self.alloc_failures += 1
                    victim = running.pop()
                    if digest_on:
                        ev(f"P {victim.request_id} {ids_str(km.get_block_ids(victim.request_id))}\n")
                    t0 = pc()
                    km.free(victim)
                    s_free.append(pc() - t0)
                    victim.status = RS.PREEMPTED
                    victim.num_computed_tokens = 0
                    victim.num_preemptions += 1
                    victim._kv_prefill_done = False
                    waiting.appendleft(victim)
                    self.preemptions += 1
                    preempted_any = True
                    if victim is req:
                        break
                if r is None:
                    break
                scheduled.append((req, n))
                budget -= n
                i += 1

            # 3. waiting loop
            if not preempted_any:
                while budget > 0 and waiting and len(running) < args.max_num_seqs:
                    req = waiting[0]
                    t0 = pc()
                    blocks, hit, _spb = km.get_computed_blocks(req)
                    s_gcb.append(pc() - t0)
                    if digest_on:
                        ev(f"G {req.request_id} {hit} {ids_str(blocks.get_block_ids())}\n")
                    n = req.num_tokens - hit
                    if n > budget:
                        n = budget
                    t0 = pc()
                    r = km.allocate_slots(
                        req,
                        n,
                        num_new_computed_tokens=hit,
                        new_computed_blocks=blocks,
                        full_sequence_must_fit=args.reserve_full_isl,
                        has_scheduled_reqs=bool(running),
                    )
                    dt = pc() - t0
                    (s_admit if r is not None else s_fail).append(dt)
                    if digest_on:
                        ev(f"A {req.request_id} {n} {hit} {'-' if r is None else ids_str(r.get_block_ids())}\n")
                    if r is None:
                        self.alloc_failures += 1
                        break
                    waiting.popleft()
                    st = self.pc_resumed if req.num_preemptions > 0 else self.pc_first
                    st[0] += 1
                    st[1] += req.num_tokens
                    st[2] += hit
                    running.append(req)
                    req.status = RS.RUNNING
                    req.num_computed_tokens = hit
                    scheduled.append((req, n))
                    budget -= n

            if not scheduled:
                if not running:
                    head = waiting[0] if waiting else None
                    raise RuntimeError(
                        f"step {step}: cannot admit {head.request_id if head else None} "
                        f"({head.num_tokens if head else 0} tokens) into an idle cache of "
                        f"{args.num_blocks} blocks; raise --num-blocks"
                    )

            # 4. model step
            finished_any = False
            for req, n in scheduled:
                req.num_computed_tokens += n
                if req.num_computed_tokens >= req.num_tokens:
                    req._kv_prefill_done = True
                    tok = self.next_output_token(req)
                    t0 = pc()
                    req.append_output_token_ids(tok)
                    self.append_ns += pc() - t0
                    self.generated_tokens += 1
                    if req.num_output_tokens >= req.max_tokens:
                        req.status = RS.FINISHED_LENGTH_CAPPED
                        if digest_on:
                            ev(f"F {req.request_id} {ids_str(km.get_block_ids(req.request_id))}\n")
                        t0 = pc()
                        km.free(req)
                        s_free.append(pc() - t0)
                        finished_any = True
                        n_finished += 1
                        self.finish_step[req.request_id] = step
                        for fidx in followers.get(req.request_id, ()):
                            heapq.heappush(pending, (step + self.records[fidx]["arrival_step"], fidx))
            if finished_any:
                running = [r for r in running if not r.is_finished()]
            if digest_on:
                nfree = block_pool.get_num_free_blocks() if block_pool is not None else -1
                ev(f"S {step} {nfree}\n")
            self.steps += 1
            step += 1
            if args.progress and self.steps % args.progress == 0:
                print(
                    f"[{time.perf_counter() - t_wall0:7.1f}s] step {step} running={len(running)} "
                    f"waiting={len(waiting)} done={n_finished}/{n_total} preempt={self.preemptions}",
                    file=sys.stderr,
                )
        self.wall_s = time.perf_counter() - t_wall0
        self.last_step = step - 1
        # Sanity: everything generated and every block back in the pool.
        expect = sum(r["max_output_tokens"] for r in self.records)
        if self.generated_tokens != expect:
            raise RuntimeError(f"generated {self.generated_tokens} tokens, expected {expect}")
        self.final_free_blocks = block_pool.get_num_free_blocks() if block_pool is not None else -1
        if block_pool is not None and self.final_free_blocks != args.num_blocks - 1:
            raise RuntimeError(f"{self.final_free_blocks} free blocks at the end, expected {args.num_blocks - 1}")
        if self.events_f is not None:
            self.events_f.close()
        return self.summary()

    # --------------------------------------------------------------- summary
    def summary(self) -> dict:
        import vllm

        args, h = self.args, self.header
        calls = {}
        kv_total = 0
        for t in CALL_TYPES:
            v = sorted(self.samples[t])
            tot = sum(v)
            kv_total += tot
            calls[t] = {
                "count": len(v),
                "total_ns": tot,
                "mean_ns": round(tot / len(v), 1) if v else 0,
                "p50_ns": pct(v, 0.5),
                "p90_ns": pct(v, 0.9),
                "p99_ns": pct(v, 0.99),
                "max_ns": v[-1] if v else 0,
            }
        a, c = calls["alloc_admit"], calls["alloc_prefill_chunk"]
        n_pf = a["count"] + c["count"]
        calls["alloc_prefill"] = {
            "count": n_pf,
            "total_ns": a["total_ns"] + c["total_ns"],
            "mean_ns": round((a["total_ns"] + c["total_ns"]) / n_pf, 1) if n_pf else 0,
        }
        n_req = len(self.records)
        q = self.pc_first[1] + self.pc_resumed[1]
        hits = self.pc_first[2] + self.pc_resumed[2]
        prompt_tokens = sum(kvtrace.prompt_len(r) for r in self.records)
        return {
            "impl": "vllm",
            "vllm_version": vllm.__version__,
            "python": platform.python_version(),
            "label": args.label,
            "trace": os.path.abspath(args.trace),
            "kind": h.get("kind"),
            "trace_seed": h.get("seed"),
            "config": {
                "kv_config": args.config,
                "num_blocks": args.num_blocks,
                "block_size": args.block_size,
                "sliding_window": args.sliding_window if args.config == "hybrid" else None,
                "max_num_batched_tokens": args.max_num_batched_tokens,
                "max_num_seqs": args.max_num_seqs,
                "max_model_len": args.max_model_len,
                "prefix_caching": not args.no_prefix_caching,
                "reserve_full_isl": args.reserve_full_isl,
                "hash_algo": args.hash_algo,
            },
            "requests": n_req,
            "prompt_tokens": prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "steps": self.steps,
            "last_step": self.last_step,
            "preemptions": self.preemptions,
            "alloc_failures": self.alloc_failures,
            "prefix_cache": {
                "queried_tokens": q,
                "hit_tokens": hits,
                "hit_rate": round(hits / q, 6) if q else 0.0,
                "first_admission": {
                    "requests": self.pc_first[0],
                    "queried_tokens": self.pc_first[1],
                    "hit_tokens": self.pc_first[2],
                },
                "resumed": {
                    "requests": self.pc_resumed[0],
                    "queried_tokens": self.pc_resumed[1],
                    "hit_tokens": self.pc_resumed[2],
                },
            },
            "calls": calls,
            "kv_total_ns": kv_total,
            "kv_ns_per_request": round(kv_total / n_req, 1) if n_req else 0,
            "kv_ns_per_generated_token": round(kv_total / self.generated_tokens, 1)
            if self.generated_tokens
            else 0,
            "request_hash_ns": self.request_init_ns + self.append_ns,
            "request_init_ns": self.request_init_ns,
            "append_token_ns": self.append_ns,
            "timer_overhead_ns": self.timer_overhead,
            "replay_wall_s": round(self.wall_s, 3),
            "setup_s": round(self.setup_s, 3),
            "final_free_blocks": self.final_free_blocks,
            "digest": self.digest.hexdigest() if self.digest is not None else None,
            "num_events": self.num_events,
        }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Replay a kvtrace through vLLM's KVCacheManager.")
    ap.add_argument("trace")
    ap.add_argument("--config", choices=("full", "hybrid"), default="full",
                    help="full: one FullAttentionSpec group; hybrid: + one SlidingWindowSpec group")
    ap.add_argument("--num-blocks", type=int, default=32768, help="KV cache blocks in the pool (incl. null block)")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--sliding-window", type=int, default=1024, help="window of the hybrid SWA group")
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192, help="token budget per step")
    ap.add_argument("--max-num-seqs", type=int, default=256, help="max running requests")
    ap.add_argument("--max-model-len", type=int, default=262144)
    ap.add_argument("--no-prefix-caching", action="store_true")
    ap.add_argument("--reserve-full-isl", type=int, choices=(0, 1), default=1,
                    help="admission needs the whole current sequence to fit (vLLM default 1)")
    ap.add_argument("--hash-algo", default="sha256",
                    help="prefix_caching_hash_algo: sha256 (vLLM default), sha256_cbor, xxhash, xxhash_cbor")
    ap.add_argument("--max-requests", type=int, default=0, help="use only the first N trace records (0 = all)")
    ap.add_argument("--max-steps", type=int, default=0, help="abort after this many executed steps (0 = no limit)")
    ap.add_argument("--events-out", help="also write the digest event lines to this file")
    ap.add_argument("--no-digest", action="store_true", help="skip the allocation digest (slightly faster)")
    ap.add_argument("--no-gc-freeze", action="store_true", help="skip gc.collect()+gc.freeze() before replay")
    ap.add_argument("--label", default=None, help="free-form label copied into the summary")
    ap.add_argument("--progress", type=int, default=0, help="print progress to stderr every N steps")
    args = ap.parse_args(argv)

    t_setup0 = time.perf_counter()
    header, records = kvtrace.read_trace(args.trace)
    if args.max_requests:
        records = records[: args.max_requests]
        keep = {r["request_id"] for r in records}
        records = [r for r in records if not r.get("after") or r["after"] in keep]
    max_seq = max(kvtrace.prompt_len(r) + r["max_output_tokens"] for r in records)
    if max_seq > args.max_model_len:
        ap.error(f"trace has a {max_seq}-token sequence > --max-model-len {args.max_model_len}")

    kv_cfg = build_kv_cache_config(args)
    manager = build_vllm_manager(args, kv_cfg)
    drv = Driver(args, header, records, manager)
    drv.timer_overhead = timer_overhead_ns()
    gc.collect()
    if not args.no_gc_freeze:
        gc.freeze()  # as vLLM's engine core does after start-up
    drv.setup_s = time.perf_counter() - t_setup0
    summary = drv.run()
    print(json.dumps(summary, separators=(",", ":")), flush=True)
    return 0


if __name__ == "__main__":
    rc = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: it only adds time and prints nanobind
    # "leaked instance" noise from the triton extension that vllm imports.
    os._exit(rc)
