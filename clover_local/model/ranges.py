"""An allowed range of a number, and how a message says it: one type for every range check.

The decoding parameters' table, the hyperparameter limits the converter and the runtime check
(`hparam_limits`) and the argument limits of the API and the CLI (`clover_local.limits`) all
declare their ranges as `Range`s, so a value is judged, and a refusal worded, the same everywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Range:
    """Finite numbers from `low` to `high` (None: unbounded), both ends included unless `low_open`;
    `integer`: whole numbers only. A bool is never a number here."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False  # the low end itself is excluded
    integer: bool = False

    def allows(self, v: object) -> bool:
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            return False
        if self.integer and not float(v).is_integer():
            return False
        if self.low is not None and (v < self.low or (self.low_open and v == self.low)):
            return False
        return self.high is None or v <= self.high

    def describe(self) -> str:
        """What `allows` accepts, as the end of "must be ...": "an integer from 1 to 256"."""
        kind = "an integer" if self.integer else "a number"
        low = None if self.low is None else f"{'>' if self.low_open else '>='} {_num(self.low)}"
        high = None if self.high is None else f"<= {_num(self.high)}"
        if low and high and not self.low_open:
            return f"{kind} from {_num(self.low)} to {_num(self.high)}"
        return f"{kind} " + " and ".join(x for x in (low, high) if x) if low or high else kind


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


UNIT = Range(0, 1)
FRACTION = Range(0, 1, low_open=True)
POSITIVE = Range(0, low_open=True)
