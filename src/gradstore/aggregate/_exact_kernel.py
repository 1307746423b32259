"""The exact accumulator's element code: binary64 terms summed in integers, rounded once.

Every finite binary64 value is ``m * 2**(p - 1074)`` with an integer ``|m| < 2**53`` and
a bit position ``0 <= p <= 2045``. Each element keeps ``LIMBS`` int64 digits of 32 bits
(digit ``k`` is worth ``2**(32 k - 1074)``); a term adds its mantissa, cut in three
pieces below ``2**32``, to the three digits its position covers. No addition rounds, so
the digits hold the exact sum whatever the order of the terms; each digit grows by less
than ``2**32`` per term, so ``MAX_TERMS`` terms cannot overflow it. At the end carries
are settled (balanced digits first, whose top non-zero digit gives the sign, then plain
digits of the magnitude) and the top 53 bits are rounded to nearest, ties to even, with
a guard bit and a sticky bit: one rounding (docs/spec.md, section 6.4, "exact").

Per element only the digits its terms touched are settled and cleared (``lo .. hi``), so
the cost follows the spread of the element's exponents, not the 2,100 bits of the range.

Compiled by numba when it loads (and ``GRADSTORE_NUMBA`` is not 0); otherwise the same
functions run as plain Python, bit for bit the same and very slow (tests compare both).
Imported by ``_exact`` only.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any, Final, Protocol, TypeVar, cast

import numpy as np

from ._fused import enabled

F = TypeVar("F", bound=Callable[..., Any])

#: int64 digits per element: positions up to 2045 + 52 bits, plus 32 bits of carries.
LIMBS: Final = 67

#: The most terms one element may sum: each adds less than 2**32 to a digit (< 2**63).
MAX_TERMS: Final = 1 << 30

#: Elements per block at most; their terms are computed input by input, then summed
#: element by element in one row of digits.
BLOCK: Final = 1024

#: Bytes of one block's terms (float64, all inputs): within L2 with the inputs' lines.
TERMS_BYTES: Final = 256 << 10

_MASK32: Final = (1 << 32) - 1
_HALF32: Final = 1 << 31
_MASK52: Final = (1 << 52) - 1
_HIDDEN: Final = 1 << 52
_NEG_ZERO: Final = -(1 << 63)  # the bits of -0.0 as an int64
_NAN: Final = 0x7FF8000000000000


class _Jit(Protocol):
    def __call__(self, function: F, /) -> F: ...


def _python(function: F) -> F:
    return function


def _numba_or_python() -> tuple[_Jit, _Jit, bool]:
    """numba's njit for the entry points and the helpers, or plain Python; whether compiled."""
    if not enabled():
        return _python, _python, False
    try:
        import numba
    except Exception:  # ImportError, or numba refusing this NumPy version
        return _python, _python, False
    entry = numba.njit(nogil=True, cache=True, error_model="numpy", boundscheck=False)
    helper = numba.njit(inline="always", cache=True, error_model="numpy", boundscheck=False)
    return cast(_Jit, entry), cast(_Jit, helper), True


_entry, _helper, COMPILED = _numba_or_python()


@_helper
def _add_at(row: Any, mantissa: int, position: int, sign: int) -> int:
    """Add ``sign * mantissa * 2**position`` (``mantissa < 2**54``) to ``row``'s digits
    ``k .. k + 2``; returns ``k``."""
    k = position >> 5
    off = position & 31
    low = (mantissa & ((1 << (32 - off)) - 1)) << off
    rest = mantissa >> (32 - off)
    row[k] += sign * low
    row[k + 1] += sign * (rest & _MASK32)
    row[k + 2] += sign * (rest >> 32)
    return k


@_helper
def _settle(row: Any, lo: int, hi: int) -> tuple[int, int, int]:
    """Settle carries in ``row[lo:]``: ``(sign, top, last)``.

    ``sign`` is 0 for an exact zero; otherwise ``row[lo .. top]`` become the plain digits
    (0 .. 2**32 - 1) of the magnitude, ``row[top]`` non-zero. ``last`` is the highest digit
    written (to be cleared)."""
    carry = 0
    k = lo
    while k <= hi or carry != 0:  # balanced digits in [-2**31, 2**31)
        value = row[k] + carry
        carry = (value + _HALF32) >> 32
        row[k] = value - (carry << 32)
        k += 1
    last = k - 1
    top = last
    while top >= lo and row[top] == 0:
        top -= 1
    if top < lo:
        return 0, top, last
    sign = 1 if row[top] > 0 else -1
    carry = 0
    for k in range(lo, top + 1):  # the magnitude's plain digits; no carry leaves ``top``
        value = sign * row[k] + carry
        carry = value >> 32
        row[k] = value & _MASK32
    while row[top] == 0:
        top -= 1
    return sign, top, last


@_helper
def _bit_length(x: int) -> int:
    """Bits of ``0 < x < 2**32``."""
    n = 0
    if x >= 1 << 16:
        x >>= 16
        n += 16
    if x >= 1 << 8:
        x >>= 8
        n += 8
    if x >= 1 << 4:
        x >>= 4
        n += 4
    if x >= 1 << 2:
        x >>= 2
        n += 2
    if x >= 1 << 1:
        x >>= 1
        n += 1
    return n + 1


@_helper
def _bits(row: Any, position: int, count: int) -> int:
    """The ``count`` (<= 53) bits of the plain digits starting at bit ``position``."""
    k = position >> 5
    got = 32 - (position & 31)
    value: int = row[k] >> (position & 31)
    while got < count:
        k += 1
        value |= row[k] << got  # bits beyond 63 fall off; only the low ``count`` are kept
        got += 32
    return value & ((1 << count) - 1)


@_helper
def _round(row: Any, lo: int, top: int) -> tuple[int, int, int]:
    """The magnitude in ``row[lo .. top]`` (plain digits) rounded to binary64, ties to even.

    Returns ``(bits, mantissa, shift)``: the binary64's bits (the positive infinity's
    beyond its range) and the rounded value as ``mantissa * 2**shift`` digit units."""
    length = 32 * top + _bit_length(row[top])
    shift = length - 53 if length > 53 else 0
    mantissa = _bits(row, shift, 53)
    if shift > 0:
        guard_at = shift - 1
        guard = (row[guard_at >> 5] >> (guard_at & 31)) & 1
        sticky = (row[guard_at >> 5] & ((1 << (guard_at & 31)) - 1)) != 0
        k = lo
        while not sticky and k < guard_at >> 5:
            sticky = row[k] != 0
            k += 1
        if guard == 1 and (sticky or (mantissa & 1) == 1):
            mantissa += 1
    value, exponent = mantissa, shift
    if value == 1 << 53:
        value >>= 1
        exponent += 1
    if value < _HIDDEN:  # subnormal (only when nothing was cut)
        return value, mantissa, shift
    biased = exponent + 1
    if biased >= 0x7FF:
        return 0x7FF << 52, mantissa, shift
    return (biased << 52) | (value & _MASK52), mantissa, shift


@_helper
def _accumulate(row: Any, terms: Any, first: int, n: int) -> tuple[int, int, bool, bool]:
    """Add the binary64 terms whose bits are ``terms[first : first + n]`` to ``row`` (all
    zero): ``(lo, hi, negzero, bad)``, the digits touched, whether every term was -0.0,
    whether one was NaN/Inf."""
    lo = LIMBS
    hi = -1
    negzero = True
    bad = False
    for i in range(first, first + n):
        bits = terms[i]
        if bits != _NEG_ZERO:
            negzero = False
        exponent = (bits >> 52) & 0x7FF
        mantissa = bits & _MASK52
        if exponent == 0:
            if mantissa == 0:  # +-0.0 adds nothing
                continue
            position = 0
        elif exponent == 0x7FF:
            bad = True
            continue
        else:
            mantissa |= _HIDDEN
            position = exponent - 1
        k = _add_at(row, mantissa, position, -1 if bits < 0 else 1)
        if k < lo:
            lo = k
        if k + 2 > hi:
            hi = k + 2
    return lo, hi, negzero, bad


@_helper
def _finish(row: Any, lo: int, hi: int, negzero: bool, bad: bool) -> int:
    """The exact sum in ``row`` rounded once (its bits); ``row`` cleared again."""
    if bad:
        for k in range(lo, hi + 1):  # nothing settled yet: only these were touched
            row[k] = 0
        return _NAN
    if hi < 0:
        return _NEG_ZERO if negzero else 0
    sign, top, last = _settle(row, lo, hi)
    out = 0
    if sign != 0:
        out, _, _ = _round(row, lo, top)
        if sign < 0:
            out |= _NEG_ZERO
    elif negzero:
        out = _NEG_ZERO
    for k in range(lo, last + 1):
        row[k] = 0
    return out


@_helper
def _block_terms(
    terms: Any, like: Any, size: int, addresses: Any, coefs: Any, block: int, width: int
) -> None:
    """``terms[j * n + i] = fl(coefs[i] * x_i[block + j])``: each element's terms together."""
    n = addresses.size
    for i in range(n):
        x = _at(addresses[i], like, size)
        c = coefs[i]
        for j in range(width):
            terms[j * n + i] = np.float64(x[block + j]) * c


@_helper
def _block_width(n: int) -> int:
    """Elements per block: their n terms each (float64) within TERMS_BYTES, at least 8."""
    return max(8, min(BLOCK, TERMS_BYTES // (8 * max(n, 1))))


@_entry
def sum_range(
    sums: Any, like: Any, size: int, addresses: Any, coefs: Any, start: int, stop: int
) -> int:
    """``sums[e - start]`` = the bits of fl_exact(sum_i fl(coefs[i] * x_i[e])) for e in
    ``start:stop``; returns how many are NaN/Inf (a non-finite term, or overflow).

    ``sums`` is an int64 array (the binary64 results' bits); ``x_i`` has ``like``'s dtype
    and ``size`` elements and starts at ``addresses[i]``. One element at a time: its
    digits (536 bytes) stay in L1."""
    n = addresses.size
    width_max = _block_width(n)
    row = np.zeros(LIMBS, np.int64)
    terms = np.empty(width_max * n, np.float64)
    term_bits = terms.view(np.int64)
    failed = 0
    for block in range(start, stop, width_max):
        width = min(block + width_max, stop) - block
        _block_terms(terms, like, size, addresses, coefs, block, width)
        for j in range(width):
            lo, hi, negzero, bad = _accumulate(row, term_bits, j * n, n)
            out = _finish(row, lo, hi, negzero, bad)
            sums[block - start + j] = out
            failed += ((out >> 52) & 0x7FF) == 0x7FF
    return failed


@_entry
def expand_range(
    components: Any,
    like: Any,
    size: int,
    addresses: Any,
    coefs: Any,
    start: int,
    stop: int,
) -> int:
    """The canonical expansion of each exact sum, as in :func:`sum_range`, into
    ``components[c, e - start]`` (int64 bits, row 0 the sum rounded once, row c the rest
    after rows 0 .. c-1 rounded once, until it is zero; the rows left +0.0, or -0.0 when
    every term was -0.0). Returns the largest count of components, or -1 for a NaN/Inf
    term or a sum beyond binary64's range, or ``components.shape[0] + 1`` if one needs
    more rows than there are."""
    rows: int = components.shape[0]
    n = addresses.size
    width_max = _block_width(n)
    row = np.zeros(LIMBS, np.int64)
    terms = np.empty(width_max * n, np.float64)
    term_bits = terms.view(np.int64)
    most = 0
    for block in range(start, stop, width_max):
        width = min(block + width_max, stop) - block
        _block_terms(terms, like, size, addresses, coefs, block, width)
        for j in range(width):
            column = block - start + j
            lo, hi, negzero, bad = _accumulate(row, term_bits, j * n, n)
            if bad:
                return -1
            count = _expand(row, lo, hi, components, column, rows)
            if count < 0:
                return -1
            if count > rows:
                return rows + 1
            padding = _NEG_ZERO if (count == 0 and negzero) else 0
            for c in range(count, rows):
                components[c, column] = padding
            if count > most:
                most = count
    return most


@_helper
def _expand(row: Any, lo: int, hi: int, components: Any, column: int, rows: int) -> int:
    """Write the canonical expansion of ``row``'s exact sum into ``components[:, column]``;
    how many components (-1: beyond binary64's range; ``rows + 1``: more than ``rows``).
    The digits are cleared."""
    count = 0
    last = hi
    while hi >= lo:
        sign, top, written = _settle(row, lo, hi)
        if written > last:
            last = written
        if sign == 0:
            break
        bits, mantissa, shift = _round(row, lo, top)
        if ((bits >> 52) & 0x7FF) == 0x7FF:
            count = -1
            break
        if count == rows:
            count = rows + 1
            break
        components[count, column] = bits | _NEG_ZERO if sign < 0 else bits
        count += 1
        # the rest: |sum| - |component|, then with the sum's sign again
        first = _add_at(row, mantissa, shift, -1)
        lo = min(lo, first)
        hi = max(top, first + 2)
        if hi > last:
            last = hi
        if sign < 0:
            for k in range(lo, hi + 1):
                row[k] = -row[k]
    for k in range(lo, last + 1):
        row[k] = 0
    return count


if COMPILED:
    from numba.np.numpy_support import carray

    from ._numba_kernel import _pointer_like

    @_helper
    def _at(address: int, like: Any, size: int) -> Any:
        """The input array of ``like``'s dtype and ``size`` elements at ``address``."""
        return carray(_pointer_like(address, like), size)  # type: ignore[call-arg]

else:

    def _at(address: int, like: Any, size: int) -> Any:
        """The input array of ``like``'s dtype and ``size`` elements at ``address`` (the
        caller keeps it alive)."""
        buffer = (ctypes.c_char * (size * like.itemsize)).from_address(int(address))
        return np.frombuffer(buffer, like.dtype, size)
