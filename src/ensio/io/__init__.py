"""Member-file I/O: one ``MemberStore`` backend per format, opened by content."""

from .open import open_member
from .store import MemberStore, VarInfo

__all__ = ["MemberStore", "VarInfo", "open_member"]
