"""rt4chart in a test suite: the assertion API (asserts) and the pytest plugin (pytest_plugin)."""

from rt4chart.testing.asserts import (
    GroundingError,
    JudgeFailed,
    SessionBudgetStop,
    aassert_grounded,
    acheck_grounded,
    assert_grounded,
    check_grounded,
    failing_claims,
)

__all__ = [
    "GroundingError",
    "JudgeFailed",
    "SessionBudgetStop",
    "aassert_grounded",
    "acheck_grounded",
    "assert_grounded",
    "check_grounded",
    "failing_claims",
]
