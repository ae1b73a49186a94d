"""A plugin module that takes ``MMP_SLOW_PLUGIN_S`` seconds to import: the ranks' activation is
slow, as a large environment's can be, before any rank can say what it does."""

import os
import time

time.sleep(float(os.environ.get("MMP_SLOW_PLUGIN_S", "0")))
