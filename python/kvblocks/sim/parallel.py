"""A sweep's configurations run at once: in spawned processes (``kvblocks simulate --jobs
N``) or as tasks on a Ray cluster (``--ray ADDRESS``).

Both run the same function over the same jobs and return the results in the jobs' order,
so a sweep reports the same whichever ran it. Ray is imported only by :func:`run_on_ray`
(``import kvblocks`` and a run without ``--ray`` never import it).

``--ray`` addresses (:func:`run_on_ray`):

* ``local``: a Ray cluster on this machine, started for the run and stopped after it, with
  one CPU per configuration up to the machine's CPUs (no dashboard);
* ``auto``: the cluster already running on this machine (``ray start --head``), as
  ``ray.init(address="auto")`` finds it;
* anything else is ``ray.init``'s ``address``: ``HOST:PORT`` of a head node, or
  ``ray://HOST:10001`` for Ray Client. The cluster's nodes need kvblocks installed (the
  same version), as its workers import it to run a configuration.

Inside a program that already called ``ray.init``, that connection is used as it is, and
left open.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

__all__ = ["RAY_LOCAL", "RayUnavailableError", "run_in_processes", "run_on_ray"]

J = TypeVar("J")
R = TypeVar("R")

RAY_LOCAL = "local"
"""The ``--ray`` address that starts a cluster on this machine for the run."""


class RayUnavailableError(RuntimeError):
    """``--ray`` cannot run: Ray is not installed, or the cluster cannot be reached."""


def run_in_processes(fn: Callable[[J], R], jobs: Sequence[J], workers: int) -> list[R]:
    """``fn`` over ``jobs`` in up to ``workers`` spawned processes; results in job order."""
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=max(1, min(workers, len(jobs))), mp_context=ctx) as ex:
        return list(ex.map(fn, jobs))


def run_on_ray(fn: Callable[[J], R], jobs: Sequence[J], address: str) -> list[R]:
    """``fn`` over ``jobs`` as Ray tasks on the cluster at ``address`` (see the module
    docs); results in job order. ``fn`` must be importable by the cluster's workers (a
    module-level function of an installed package).

    Raises:
        RayUnavailableError: Ray is not installed, or the cluster cannot be reached.
    """
    try:
        import ray
    except ImportError as e:
        raise RayUnavailableError(f"--ray needs Ray ({e}): pip install 'kvblocks[ray]'") from None
    started = not ray.is_initialized()
    if started:
        _check_reachable(address)
        try:
            if address == RAY_LOCAL:
                cpus = max(1, min(len(jobs), os.cpu_count() or 1))
                ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
            else:
                ray.init(address=address, log_to_driver=False)
        except (ConnectionError, ValueError, RuntimeError) as e:
            raise RayUnavailableError(f"--ray {address}: cannot connect: {e}") from None
    try:
        task: Any = ray.remote(fn)
        return list(ray.get([task.remote(job) for job in jobs]))
    finally:
        if started:
            ray.shutdown()


def _check_reachable(address: str) -> None:
    """A ``HOST:PORT`` address must accept a connection (``ray.init`` would retry one that
    does not for minutes); ``local``, ``auto`` and ``ray://`` ones are left to Ray."""
    host, sep, port = address.rpartition(":")
    if address == RAY_LOCAL or "://" in address or not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as e:
        raise RayUnavailableError(f"--ray {address}: cannot connect: {e}") from None
