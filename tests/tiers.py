"""The suite's two tiers. The default one (the README's test command) keeps within BUDGET_S on two CPU
cores with `-n 2` and runs one case of each slow end-to-end family; ATGRPO_FULL_SUITE=1 runs the other
cases too (before a release, or when touching what they cover). A case of the full tier only is marked
`@pytest.mark.full` (a test) or `full_case(...)` (a parametrized case), with a comment naming what keeps
its family in the default tier; the default tier deselects them (tests/conftest.py), so
`ATGRPO_FULL_SUITE=1 python -m pytest --collect-only -q -m full` lists them. docs/design/developers.md has
the budget per area and how a new test stays within it."""
import os

import pytest

FULL = os.environ.get("ATGRPO_FULL_SUITE") == "1"
BUDGET_S = 12 * 60  # the default tier's wall time on two CPU cores with -n 2 (docs/design/developers.md)
SLOWEST_SHOWN = 15  # the slowest tests every run prints with its total (tests/conftest.py)


def full_case(*values, id=None):
    """A parametrized case of the full tier only: `[full_case(0), 2]` runs 2 by default and both in the full tier."""
    return pytest.param(*values, marks=pytest.mark.full, id=id)
