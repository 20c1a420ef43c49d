"""``JobRunner``: the epoch runner for custom training loops (its loop, its objects' files, its multi-process share)."""
