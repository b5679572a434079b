"""An app module whose own code fails at import (a setting it reads is missing)."""

import os

SETTING = os.environ["FORGEZERO_TESTS_SETTING_NOBODY_SETS"]
