"""rt4chart in a test suite: the assertion API (asserts) and the pytest plugin (pytest_plugin).

The names below are imported on first use: the plugin is loaded by every pytest session of an
environment that has rt4chart, and a session that never audits must not pay for the audit's imports.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rt4chart.report.tables import support_score as support_score
    from rt4chart.testing.asserts import GroundingError as GroundingError
    from rt4chart.testing.asserts import JudgeFailed as JudgeFailed
    from rt4chart.testing.asserts import SessionBudgetStop as SessionBudgetStop
    from rt4chart.testing.asserts import aassert_grounded as aassert_grounded
    from rt4chart.testing.asserts import acheck_grounded as acheck_grounded
    from rt4chart.testing.asserts import assert_grounded as assert_grounded
    from rt4chart.testing.asserts import check_grounded as check_grounded
    from rt4chart.testing.asserts import failing_claims as failing_claims

__all__ = [
    "GroundingError",
    "JudgeFailed",
    "SessionBudgetStop",
    "aassert_grounded",
    "acheck_grounded",
    "assert_grounded",
    "check_grounded",
    "failing_claims",
    "support_score",
]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'rt4chart.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module("rt4chart.testing.asserts"), name)
    globals()[name] = value
    return value
