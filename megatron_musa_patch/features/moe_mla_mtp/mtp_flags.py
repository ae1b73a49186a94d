"""MT-Megatron's multi-token-prediction flags, as aliases of upstream's.

``--use-multi-token-prediction`` switches MTP on, ``--mtp-depth N`` is upstream's
``--mtp-num-layers N`` (depth 1 when only the switch is given) and ``--mtp-coeff C`` is
``--mtp-loss-scaling-factor C``. Giving both spellings of one setting with different values is an
error naming both, rather than a silent pick.
"""

from __future__ import annotations

from megatron_musa_patch.base.errors import ArgumentError
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.core.feature import feature

FEATURE = feature(
    __name__,
    "--use-multi-token-prediction / --mtp-depth / --mtp-coeff (MT-Megatron spellings)",
    aliases=("mtp_flags",))

# upstream's default for --mtp-loss-scaling-factor: only a different value counts as "given"
UPSTREAM_SCALING_DEFAULT = 0.1


@hookimpl
def mmp_add_arguments(parser):
    group = parser.add_argument_group("multi-token prediction (MT-Megatron spellings)")
    group.add_argument("--use-multi-token-prediction", action="store_true",
                       help="Train with multi-token prediction (upstream: --mtp-num-layers).")
    group.add_argument("--mtp-depth", type=int, default=None,
                       help="Number of MTP modules; implies --use-multi-token-prediction "
                            "(upstream: --mtp-num-layers). Default 1 with the switch.")
    group.add_argument("--mtp-coeff", type=float, default=None,
                       help="Weight of the MTP loss (upstream: --mtp-loss-scaling-factor).")


@hookimpl
def mmp_validate_args(args):
    depth = getattr(args, "mtp_depth", None)
    coeff = getattr(args, "mtp_coeff", None)
    enabled = getattr(args, "use_multi_token_prediction", False) or depth is not None
    if coeff is not None and not enabled and not args.mtp_num_layers:
        raise ArgumentError("--mtp-coeff sets the weight of the multi-token-prediction loss, but "
                            "MTP is off: add --use-multi-token-prediction (or --mtp-depth N).")
    if depth is not None and depth < 1:
        raise ArgumentError(f"--mtp-depth {depth}: give at least 1 (or drop the flag).")
    if enabled:
        depth = depth if depth is not None else (args.mtp_num_layers or 1)
        if args.mtp_num_layers not in (None, depth):
            raise ArgumentError(
                f"--mtp-depth {depth} (MT-Megatron spelling) and --mtp-num-layers "
                f"{args.mtp_num_layers} (upstream spelling) disagree: keep one of them.")
        args.mtp_num_layers = depth
    if coeff is not None:
        upstream = args.mtp_loss_scaling_factor
        if upstream not in (UPSTREAM_SCALING_DEFAULT, coeff):
            raise ArgumentError(
                f"--mtp-coeff {coeff} (MT-Megatron spelling) and --mtp-loss-scaling-factor "
                f"{upstream} (upstream spelling) disagree: keep one of them.")
        args.mtp_loss_scaling_factor = coeff
