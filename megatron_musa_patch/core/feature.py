"""A feature's declaration: its name, what it is, what needs it, and what it is ordered after.

A built-in feature module says ``FEATURE = feature(__name__, "...")``: its name is its path under
``megatron_musa_patch.features`` (``features/fused_ops/rope.py`` is ``fused_ops.rope``), so a
toggle, a row of ``mmp patches`` and a module are one name. An external plugin may declare
``FEATURE = Feature("name", "...")`` or, in the older form, a string with ``REQUIRED``,
``DESCRIPTION`` and ``FLAG_NEEDS`` beside it; :func:`declaration` reads both.

Order: pluggy calls the last-registered plugin's hooks first, so a feature registered after
another has its hooks called before the other's, and its patches registered and applied first:
where both wrap one upstream function, its wrapper ends up *inside* the other's. ``after`` names
the features it must follow (a name that is only a group's: all of its features);
:func:`ordered` is the registration order of the built-in features, by name otherwise (a
feature's first name, for one that moved). External plugins are
registered after all of them (their wrappers sit innermost); pluggy's ``tryfirst`` /
``trylast`` order their hooks.
"""

from __future__ import annotations

import dataclasses
import heapq
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from megatron_musa_patch.base.errors import PluginError
from .records import VERIFIED, Patch, layer_range, patches_at
from .toggles import names_of
from megatron_musa_patch.upstream import tables

FEATURES_PACKAGE = "megatron_musa_patch.features"


@dataclasses.dataclass(frozen=True)
class Feature:
    name: str
    description: str
    #: device and collective plumbing that every run needs (kept by ``..._ONLY``)
    required: bool = False
    #: the Megatron flags that work only through this feature (``core.flag_needs.FlagNeed``)
    flag_needs: Tuple[Any, ...] = ()
    #: features or groups registered before this one (see the module docstring)
    after: Tuple[str, ...] = ()
    #: earlier names of this feature, which toggles still take (a feature that moved)
    aliases: Tuple[str, ...] = ()
    #: groups that do not switch this feature: it joined them after their name was in use, and
    #: a name keeps meaning what it meant (``fused_ops`` is the five fusions it always was)
    kept_out: Tuple[str, ...] = ()
    #: a feature of this package (``feature()``): its records were verified with the layer
    builtin: bool = dataclasses.field(default=False, compare=False)

    def record_id(self, part: str = "") -> str:
        """The id of this feature's record ``part`` (the feature's own name for ``""``)."""
        return f"{self.name}.{part}" if part else self.name

    def patch(self, part: str, target: str, kind: str, impl: Any, **fields: Any) -> Patch:
        """This feature's record ``part`` (``core.records.Patch``). A built-in feature's record
        takes what its ranges leave open from the layer's verified ones (``records.layer_range``);
        an external plugin's names them."""
        return Patch(self.record_id(part), target, kind, impl, self.name, **self._ranges(fields))

    def patches_at(self, name: str, part: str, kind: str, impl: Any, **fields: Any) -> list:
        """This feature's records on the logical target ``name`` (``core.records.patches_at``)."""
        return patches_at(name, self.record_id(part), kind, impl, self.name,
                          **self._ranges(fields))

    def _ranges(self, fields: dict) -> dict:
        if not self.builtin:
            return fields
        fields = dict(fields, megatron=layer_range(fields.get("megatron", VERIFIED),
                                                   tables.MEGATRON_VERIFIED))
        if fields.get("torch") is not None:
            fields["torch"] = layer_range(fields["torch"], tables.TORCH_VERIFIED)
        return fields


def feature(module_name: str, description: str, *, required: bool = False,
            flag_needs: Sequence[Any] = (), after: Sequence[str] = (),
            aliases: Sequence[str] = (), kept_out: Sequence[str] = ()) -> Feature:
    """The declaration of the built-in feature defined by module ``module_name``."""
    prefix = FEATURES_PACKAGE + "."
    if not module_name.startswith(prefix):
        raise PluginError(f"feature() is for modules under {FEATURES_PACKAGE} ({module_name} is "
                          f"not one); an external plugin declares Feature('name', ...).")
    return Feature(module_name[len(prefix):], description, required, tuple(flag_needs),
                   tuple(after), tuple(aliases), tuple(kept_out), builtin=True)


def declaration(plugin: Any) -> Optional[Feature]:
    """What ``plugin`` declares, or None for an object that is not a feature."""
    declared = getattr(plugin, "FEATURE", None)
    if declared is None or isinstance(declared, Feature):
        return declared
    return Feature(str(declared), getattr(plugin, "DESCRIPTION", ""),
                   bool(getattr(plugin, "REQUIRED", False)),
                   tuple(getattr(plugin, "FLAG_NEEDS", ())))


def ordered(plugins: Iterable[Any]) -> List[Any]:
    """The plugins in registration order: each after what its ``after`` names; otherwise by name.

    A name in ``after`` that matches no feature, or a cycle, is refused: an ordering that quietly
    stopped applying would change which wrapper sits outside which."""
    by_name: Dict[str, Any] = {}
    decl: Dict[str, Feature] = {}
    for plugin in plugins:
        declared = declaration(plugin)
        if declared.name in by_name:  # one would silently replace the other
            raise PluginError(f"two plugins declare the feature '{declared.name}'; rename one of "
                              f"them.")
        by_name[declared.name], decl[declared.name] = plugin, declared
    preds: Dict[str, set] = {name: set() for name in by_name}
    for name, d in decl.items():
        for wanted in d.after:
            # the features a toggle of that name switches: a feature, its earlier name, a group
            matched = [wanted] if wanted in by_name else [
                o for o in by_name if o != name and
                wanted in names_of(o, decl[o].aliases, decl[o].kept_out)]
            if not matched:
                raise PluginError(f"feature '{name}' is declared after '{wanted}', which names no "
                                  f"feature; fix the name in its feature(..., after=...).")
            preds[name].update(matched)
    # by the first name a feature had: moving it to another group does not reorder its hooks
    key = {name: (d.aliases[0] if d.aliases else name, name) for name, d in decl.items()}
    ready = [key[n] for n, p in preds.items() if not p]
    heapq.heapify(ready)
    order: List[str] = []
    while ready:
        _, name = heapq.heappop(ready)
        order.append(name)
        for other, p in preds.items():
            if name in p:
                p.discard(name)
                if not p:
                    heapq.heappush(ready, key[other])
    if len(order) != len(by_name):
        stuck = sorted(set(by_name) - set(order))
        raise PluginError(f"features {', '.join(stuck)} are ordered after each other (a cycle in "
                          f"their after=...); remove one of the declarations.")
    return [by_name[n] for n in order]
