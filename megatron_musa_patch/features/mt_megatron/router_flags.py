"""MT-Megatron's MoE router flags as aliases of megatron-core's own (MooreThreads/MT-MegatronLM,
``musa_patch/arguments.py``; the meaning read from its ``moe_utils.py`` / ``router.py``):

* ``--moe-router-use-sigmoid`` -> ``--moe-router-score-function sigmoid``. MT applies it with
  ``--moe-router-pre-softmax`` only (and routes with softmax otherwise): refused without it. MT
  normalises the selected sigmoid probabilities only with ``--moe-router-norm-topk-prob``; without
  it they stay unnormalised (``moe_mla_mtp.moe_device_balance.topk_prob_norm``).
* ``--moe-router-topk-limited-devices M`` -> ``--moe-router-group-topk M`` with
  ``--moe-router-num-groups`` = the expert-parallel size (each token's experts on at most M
  devices), or = ``--moe-router-num-node-group`` when given (MT's node-limited routing). A group
  is scored by the sum of its top-(k/M) scores, as MT's node-limited path does (MT's device path
  scored a group by its best expert).
* ``--moe-router-num-node-group G`` -> ``--moe-router-num-groups G``.
* ``--moe-noaux-gamma g`` -> ``--moe-router-enable-expert-bias --moe-router-bias-update-rate g``
  (DeepSeek's aux-loss-free balancing: a per-expert bias added for selection only, moved by g
  towards balance after each step). megatron-core applies it with sigmoid scores only.

Both spellings of one setting with different values is an error naming both.
"""

from __future__ import annotations

from megatron_musa_patch.base.errors import ArgumentError
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.core.feature import feature

# after the balance features: pluggy validates last-registered first, so MT's aliases are in
# place before the balance flags are checked
FEATURE = feature(
    __name__,
    "--moe-router-use-sigmoid, --moe-router-topk-limited-devices, --moe-router-num-node-group, "
    "--moe-noaux-gamma (MT-Megatron spellings)",
    after=("moe_mla_mtp.moe_device_balance",
           "moe_mla_mtp.moe_device_balance.complementary_seq_aux_loss",
           "moe_mla_mtp.moe_device_balance.topk_prob_norm",
           "moe_mla_mtp.moe_device_balance.group_score"))

#: upstream's default for --moe-router-bias-update-rate: only another value counts as "given"
UPSTREAM_BIAS_RATE = 1e-3
UPSTREAM_SCORE = "softmax"


@hookimpl
def mmp_add_arguments(parser):
    group = parser.add_argument_group("MoE router (MT-Megatron spellings)")
    group.add_argument("--moe-router-use-sigmoid", action="store_true",
                       help="Sigmoid routing scores, with --moe-router-pre-softmax (upstream: "
                            "--moe-router-score-function sigmoid).")
    group.add_argument("--moe-router-topk-limited-devices", type=int, default=None,
                       help="Route each token to experts on at most this many expert-parallel "
                            "devices (upstream: --moe-router-group-topk with "
                            "--moe-router-num-groups = EP size).")
    group.add_argument("--moe-router-num-node-group", type=int, default=None,
                       help="Number of expert groups for device/node-limited routing "
                            "(upstream: --moe-router-num-groups).")
    group.add_argument("--moe-noaux-gamma", type=float, default=None,
                       help="Aux-loss-free balancing: bias update rate (upstream: "
                            "--moe-router-enable-expert-bias --moe-router-bias-update-rate).")


def _same(name_mt, value_mt, name_up, value_up, default=None):
    if value_up not in (default, value_mt):
        raise ArgumentError(
            f"{name_mt} {value_mt} (MT-Megatron spelling) and {name_up} {value_up} (upstream "
            f"spelling) disagree: keep one of them.")


@hookimpl
def mmp_validate_args(args, session):
    sigmoid = getattr(args, "moe_router_use_sigmoid", False)
    limited = getattr(args, "moe_router_topk_limited_devices", None)
    node_groups = getattr(args, "moe_router_num_node_group", None)
    gamma = getattr(args, "moe_noaux_gamma", None)
    given = [f for f, on in (("--moe-router-use-sigmoid", sigmoid),
                             ("--moe-router-topk-limited-devices", limited is not None),
                             ("--moe-router-num-node-group", node_groups is not None),
                             ("--moe-noaux-gamma", gamma is not None)) if on]
    if not given:
        return
    if not args.num_experts:
        raise ArgumentError(f"{', '.join(given)} configure the MoE router: add --num-experts.")
    if sigmoid:
        if not args.moe_router_pre_softmax:
            raise ArgumentError(
                "--moe-router-use-sigmoid is applied by MT-Megatron only together with "
                "--moe-router-pre-softmax (without it MT routes with softmax and ignores the "
                "flag): add --moe-router-pre-softmax, or drop --moe-router-use-sigmoid.")
        if args.moe_router_score_function not in (UPSTREAM_SCORE, "sigmoid"):
            raise ArgumentError(
                f"--moe-router-use-sigmoid (MT-Megatron spelling of sigmoid scores) and "
                f"--moe-router-score-function {args.moe_router_score_function} (upstream "
                f"spelling) disagree: keep one of them.")
        args.moe_router_score_function = "sigmoid"
        if not getattr(args, "moe_router_norm_topk_prob", False):
            session.require(
                "moe_mla_mtp.moe_device_balance.topk_prob_norm", "--moe-router-use-sigmoid",
                because="without --moe-router-norm-topk-prob MT-Megatron leaves the selected "
                        "sigmoid probabilities unnormalised; megatron-core always normalises",
                instead="add --moe-router-norm-topk-prob (megatron-core's own sigmoid routing)")
    for name, value in (("--moe-router-topk-limited-devices", limited),
                        ("--moe-router-num-node-group", node_groups)):
        if value is not None and value < 1:
            raise ArgumentError(f"{name} {value}: give at least 1 (or drop the flag).")
    if node_groups is not None:
        _same("--moe-router-num-node-group", node_groups, "--moe-router-num-groups",
              args.moe_router_num_groups)
        args.moe_router_num_groups = node_groups
    if limited is not None:
        _same("--moe-router-topk-limited-devices", limited, "--moe-router-group-topk",
              args.moe_router_group_topk)
        if node_groups is None:
            ep = args.expert_model_parallel_size
            _same("--moe-router-topk-limited-devices (groups = --expert-model-parallel-size)",
                  ep, "--moe-router-num-groups", args.moe_router_num_groups)
            args.moe_router_num_groups = ep
        if limited > args.moe_router_num_groups:
            raise ArgumentError(
                f"--moe-router-topk-limited-devices {limited} is more than the "
                f"{args.moe_router_num_groups} expert groups (--expert-model-parallel-size, or "
                f"--moe-router-num-node-group): give at most {args.moe_router_num_groups}.")
        args.moe_router_group_topk = limited
        # consumed: upstream's deprecated TransformerConfig field of the same name is filled
        # from args too, and megatron-core refuses it beside moe_router_group_topk
        args.moe_router_topk_limited_devices = None
    if gamma is not None:
        if gamma <= 0:
            raise ArgumentError(f"--moe-noaux-gamma {gamma}: the bias update rate must be > 0.")
        if args.moe_router_score_function != "sigmoid":
            raise ArgumentError(
                "--moe-noaux-gamma is megatron-core's aux-loss-free expert bias "
                "(--moe-router-enable-expert-bias --moe-router-bias-update-rate), which it "
                "applies with sigmoid routing scores only: add --moe-router-use-sigmoid (with "
                "--moe-router-pre-softmax) or --moe-router-score-function sigmoid, or drop "
                "--moe-noaux-gamma.")
        _same("--moe-noaux-gamma", gamma, "--moe-router-bias-update-rate",
              args.moe_router_bias_update_rate, UPSTREAM_BIAS_RATE)
        args.moe_router_enable_expert_bias = True
        args.moe_router_bias_update_rate = gamma
