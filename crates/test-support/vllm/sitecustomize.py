"""Stops vLLM's workers spinning for a second after every step (fleetdeck's test and bench servers only).

vLLM's multiprocess executor hands each step to its worker through a shared-memory queue whose reader
busy-loops (`sched_yield`) for `SpinCondition.busy_loop_s`, one second, after every read; only then does it
wait on the ZMQ notification the writer sends with every write. On a GPU node each worker has cores to
spare. Here two or three servers share two cores, and every worker that served a request in the last second
holds a whole core spinning, so the other servers' steps and every API server wait for a core: client TTFT
tails of 300-900 ms on requests vLLM computes in 20-45 ms (`cargo xtask bench real --engine vllm`).

So the readers here wait on the notification at once (`busy_loop_s` 0). vLLM's idle path can miss a
notification (with no busy loop, requests took 20-35 s: whole multiples of the 5 s recheck that rescues a
missed one), so the recheck drops to `RECHECK_MS`: an idle worker wakes every 2 ms (a few percent of a core),
and a missed notification costs at most that. Nothing else in vLLM changes.

Python runs `sitecustomize` at start-up in every process with this folder on PYTHONPATH, the spawned
EngineCore and Worker included (vLLM's CPU platform spawns them), so the patch is made when the module is
imported: a meta-path finder wraps that one module's loader. FLEETDECK_VLLM_BUSY_LOOP=1 leaves vLLM as it
ships, to compare.
"""

import importlib.abc
import importlib.machinery
import os
import sys

_MODULE = "vllm.distributed.device_communicators.shm_broadcast"
RECHECK_MS = 2


def _patch(module):
    init = module.SpinCondition.__init__

    def no_busy_loop(self, is_reader, context, notify_address, busy_loop_s=1):
        init(self, is_reader, context, notify_address, busy_loop_s=0)

    module.SpinCondition.__init__ = no_busy_loop
    module.SHM_READER_RECHECK_INTERVAL_MS = RECHECK_MS
    # One line in the server's log, so that a run shows the patch took.
    sys.stderr.write("fleetdeck sitecustomize: vLLM shared-memory readers do not busy-loop\n")


class _Loader(importlib.abc.Loader):
    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


if os.environ.get("FLEETDECK_VLLM_BUSY_LOOP") != "1":
    sys.meta_path.insert(0, _Finder())
