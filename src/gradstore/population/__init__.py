"""Population-based training over CIDs: the member reports, the signed decision record and
the roles (controller, member) that run them on IPFS nodes. The pure rules they apply are
``gradstore.pbt``, re-exported here."""

from .. import pbt
from ..pbt import *  # noqa: F403  (the rules, under the names gradstore.pbt gives them)

__all__ = list(pbt.__all__)
