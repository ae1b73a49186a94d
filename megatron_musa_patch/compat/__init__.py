"""What differs between the supported Megatron releases, in one place.

Features name the upstream objects they patch by a logical name and stay version-neutral; this
package knows, per release range:

* ``targets`` -- where each object lives (``core_transformer_config_from_args`` moved to
  ``argument_utils`` in 0.18, ``track_moe_metrics`` became ``MoEMetricsTracker.report``, ...).
  :func:`variants` turns one logical target into the records of one patch, one per range;
* ``facts`` -- behaviour a feature must know about (an upstream bug fixed in a release, a class
  that no longer exists), as named ranges a feature asks the session about.

Calling conventions are bound by signature (``binding``) rather than by release, so most
argument changes need no entry here.
"""

from .facts import FACTS, holds  # noqa: F401
from .targets import TARGETS, load, patches, variants  # noqa: F401
