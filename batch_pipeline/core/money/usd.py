"""Dollar amounts as a person reads them: ``$0.0379``, ``$0.0000193``, ``$12.34`` (not ``1.9274999999e-05``)."""

import math


def format_usd(amount: float) -> str:
    """Cents from a dollar up; below a dollar three significant digits (per-item costs are fractions of a cent)."""
    if amount == 0 or not math.isfinite(amount):
        return "$0.00" if amount == 0 else f"${amount}"
    sign, a = ("-" if amount < 0 else ""), abs(amount)
    if a >= 1:
        return f"{sign}${a:,.2f}"
    decimals = max(2, 2 - math.floor(math.log10(a)))
    return f"{sign}${a:.{decimals}f}"
