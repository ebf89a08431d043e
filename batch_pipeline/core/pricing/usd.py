"""Dollar amounts as a person reads them: ``$0.0379``, ``$0.0000193``, ``$12.34`` (not ``1.9274999999e-05``)."""

import math


def format_budget(amount: float | None) -> str:
    """A budget as dollars, or that the spec sets none (``budget_usd`` is optional)."""
    return "none set" if amount is None else format_usd(amount)


def format_usd(amount: float) -> str:
    """Cents from a dollar up; below a dollar up to three significant digits, never fewer than two decimals
    (per-item costs are fractions of a cent: ``$0.0000052``, never ``$0.0000``)."""
    if amount == 0 or not math.isfinite(amount):
        return "$0.00" if amount == 0 else f"${amount}"
    sign, a = ("-" if amount < 0 else ""), abs(amount)
    if a >= 1:
        return f"{sign}${a:,.2f}"
    decimals = max(2, 2 - math.floor(math.log10(a)))
    text = f"{a:.{decimals}f}"
    if "." in text and len(text.split(".")[1]) > 2:  # trailing zeros say nothing: $0.0021, not $0.00210
        whole, frac = text.split(".")
        text = f"{whole}.{frac.rstrip('0').ljust(2, '0')}"
    return f"{sign}${text}"


def usd_figure(amount: float) -> float:
    """A stored dollar figure (quotes): 6 significant digits below a dollar, so a sub-cent quote keeps its digits
    (0.0000016, not 0.000002: rounded to 6 decimals a 40-row embeddings job read 25% high), 6 decimals from a
    dollar up."""
    return float(f"{amount:.6g}") if abs(amount) < 1 else round(amount, 6)
