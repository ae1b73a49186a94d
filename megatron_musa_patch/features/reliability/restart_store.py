"""A group that torchrun restarts connects again: its process groups get store keys of their own.

torchrun keeps one TCPStore server for the whole job and gives every attempt's workers its address
(``TORCHELASTIC_USE_AGENT_STORE=True``), and torch's ``env://`` rendezvous adds no per-attempt
prefix ("we create a new TCPStore for every retry", which the shared server is not). A restarted
group's gloo or NCCL rendezvous therefore finds the addresses the previous attempt's ranks left
under the same keys and connects to dead ports: ``Gloo connectFullMesh failed ... Connection
refused``, or a connect timeout after 5 minutes (pytorch/pytorch#135712, #167288). The record on
Megatron's ``_initialize_distributed`` hands ``init_process_group`` a client of that store under
the prefix ``mmp_attempt_<TORCHELASTIC_RESTART_COUNT>/`` -- the prefix torch's own rendezvous used
before the store was shared. Every process group of the job is keyed under it (``new_group`` uses
the default group's store).

The restart count is the local agent's. On one node it numbers the attempts. On several nodes an
agent that restarts because another node failed does not count that restart, so the prefixes of
two nodes could differ: there the record leaves the store alone and says once to use the c10d
rendezvous with torch's ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (each attempt then gets a fresh
store; ``mmp run`` sets it). The static rendezvous (``--master-addr``/``--master-port``) shares
its store whatever that variable says.
"""

from __future__ import annotations

import functools
import os
import sys
from datetime import timedelta

from megatron_musa_patch.upstream.binding import call_arguments
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.core.records import VERIFIED
from megatron_musa_patch.upstream.args import args_read_by
from megatron_musa_patch.core.feature import feature

FEATURE = feature(
    __name__,
    "a group torchrun restarts gets store keys of its own (no stale peer addresses)",
    # both wrap _initialize_distributed: its wrapper sits inside the writer queue's fork
    after=("startup.forked_write_queue",),
    aliases=("restart_store",))


INITIALIZE = "megatron.training.initialize"
SHARED = "TORCHELASTIC_USE_AGENT_STORE"
OPT_OUT = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
PREFIX = "mmp_attempt_"


@hookimpl
def mmp_register_patches(session, registry):
    registry.add(
        FEATURE.patch(
            "initialize_distributed",
            f"{INITIALIZE}:_initialize_distributed",
            "wrap",
            functools.partial(_initialize_distributed, session.state_for(FEATURE.name)),
            why="a restarted group's process groups do not read the previous attempt's addresses",
            torch=VERIFIED,
        )
    )


def attempt_prefix(environ) -> str | None:
    """The key prefix for this attempt, or None where the store is not torchrun's shared one
    (or where the local restart count does not number the attempts: several nodes)."""
    if environ.get(SHARED) != "True" or "TORCHELASTIC_RESTART_COUNT" not in environ:
        return None
    if int(environ.get("GROUP_WORLD_SIZE", "1")) > 1:
        return None
    return f"{PREFIX}{int(environ['TORCHELASTIC_RESTART_COUNT'])}/"


def several_nodes_warning(environ) -> str | None:
    if environ.get(SHARED) != "True" or int(environ.get("GROUP_WORLD_SIZE", "1")) <= 1:
        return None
    if int(environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) <= 0:
        return None
    return (f"megatron_musa_patch: warning: torchrun restarts this job on "
            f"{environ['GROUP_WORLD_SIZE']} nodes through one TCPStore shared by every attempt; "
            f"a restarted group can read the previous attempt's addresses and fail to connect "
            f"(pytorch/pytorch#135712). Use the c10d rendezvous (--rdzv-backend c10d "
            f"--rdzv-endpoint HOST:PORT, not --master-addr/--master-port) with {OPT_OUT}=1, "
            f"which `mmp run` sets: each attempt then gets a store of its own.")


def _initialize_distributed(state, wrapped, instance, args, kwargs):
    call = call_arguments(wrapped, args, kwargs)
    if call.get("store") is None:
        prefix = attempt_prefix(os.environ)
        if prefix is not None:
            minutes = getattr(args_read_by(INITIALIZE), "distributed_timeout_minutes", 10)
            call["store"] = attempt_store(prefix, os.environ, timedelta(minutes=minutes))
        else:
            text = several_nodes_warning(os.environ)
            if text and not state.get("warned") and os.environ.get("RANK", "0") == "0":
                state["warned"] = True
                print(text, file=sys.stderr, flush=True)
    return wrapped(**call)


def attempt_store(prefix: str, environ, timeout: timedelta):
    """A client of the agent's store (as torch's env:// rendezvous makes one) under ``prefix``."""
    import torch.distributed as dist

    store = dist.TCPStore(environ["MASTER_ADDR"], int(environ["MASTER_PORT"]),
                          is_master=False, timeout=timeout)
    return dist.PrefixStore(prefix, store)
