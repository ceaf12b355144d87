"""The Kubernetes value grammars a ServingPool's fields must follow, in one place.

Each regular expression here is used twice: by the pydantic models (operator/models.py) and, through
crdgen, by the CRD schema (`pattern`, or CEL `matches()` for map keys), so the API server and the
operator reject the same values. They follow Kubernetes' own validators:
- quantities: k8s.io/apimachinery/pkg/api/resource/quantity.go (ParseQuantity), without a sign
  (container resources must not be negative);
- label values, qualified names (label keys, toleration keys): k8s.io/apimachinery/pkg/util/validation
  (IsValidLabelValue, IsQualifiedName);
- DNS-1123 subdomains (Secret, PersistentVolumeClaim names), DNS-1123 labels (namespaces) and
  DNS-1035 labels (Service names, hence pool names): the same file (IsDNS1123Subdomain, ...).
The regular expressions are RE2- and Python-compatible (CEL's `matches` is RE2).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

# <quantity> ::= <number><suffix>; suffix: binary SI (Ki..Ei), decimal SI (n u m "" k M G T P E) or
# a decimal exponent (e/E and a signed integer).
QUANTITY = r"^\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
QUANTITY_MAX_LENGTH = 64

LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"
LABEL_VALUE_MAX_LENGTH = 63

_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_SUBDOMAIN = rf"^{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*$"
DNS1123_SUBDOMAIN_MAX_LENGTH = 253
DNS1123_LABEL = rf"^{_DNS1123_LABEL}$"
DNS1123_LABEL_MAX_LENGTH = 63
DNS1035_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"

# [prefix/]name: prefix a DNS-1123 subdomain, name up to 63 characters of [A-Za-z0-9_.-].
QUALIFIED_NAME = (
    rf"^({_DNS1123_LABEL}(\.{_DNS1123_LABEL})*/)?([A-Za-z0-9][-A-Za-z0-9_.]{{0,61}})?[A-Za-z0-9]$"
)
QUALIFIED_NAME_MAX_LENGTH = 253 + 1 + 63

# Container images: Kubernetes refuses leading or trailing whitespace; no registry accepts any inside.
IMAGE = r"^\S+$"

_SUFFIXES = {
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
    "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"),
    "P": Decimal("1e15"), "E": Decimal("1e18"),
    "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30), "Ti": Decimal(2**40),
    "Pi": Decimal(2**50), "Ei": Decimal(2**60),
}  # fmt: skip
_QUANTITY_RE = re.compile(QUANTITY)


def is_quantity(value: object) -> bool:
    """A non-negative Kubernetes quantity: an int >= 0 or a string in the quantity grammar."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return value >= 0
    if not isinstance(value, str) or len(value) > QUANTITY_MAX_LENGTH:
        return False
    return bool(_QUANTITY_RE.fullmatch(value))


def parse_quantity(value: object) -> Decimal:
    """The numeric value of a quantity ("500m" -> 0.5, "1Gi" -> 1073741824); ValueError if invalid."""
    if not is_quantity(value):
        raise ValueError(f"not a Kubernetes quantity: {value!r}")
    if isinstance(value, int):
        return Decimal(value)
    text = str(value).lstrip("+")
    match = re.fullmatch(r"([0-9.]+)(.*)", text)
    assert match is not None  # the grammar above guarantees a number first
    number, suffix = match.groups()
    try:
        if suffix[:1] in ("e", "E"):
            return Decimal(number) * (Decimal(10) ** int(suffix[1:]))
        return Decimal(number) * _SUFFIXES[suffix]
    except (InvalidOperation, KeyError, OverflowError) as exc:
        raise ValueError(f"not a Kubernetes quantity: {value!r}") from exc


def same_quantity(a: object, b: object) -> bool:
    """Two quantities with one value ("1000m" and "1", "1024Mi" and "1Gi": the API server may
    rewrite a quantity into its canonical form, which is not a change)."""
    try:
        return parse_quantity(a) == parse_quantity(b)
    except ValueError:
        return a == b
