"""reasonrl.verifiers — rule-based rewards. Imports neither torch nor ray."""
from .base import (
    ENTRY_POINT_GROUP,
    Verifier,
    VerifyResult,
    available_verifiers,
    get_verifier,
    get_verifier_class,
    register_verifier,
)
from .pool import VerifierPool

__all__ = [
    "ENTRY_POINT_GROUP", "Verifier", "VerifyResult", "available_verifiers", "get_verifier",
    "get_verifier_class", "register_verifier", "VerifierPool",
]
