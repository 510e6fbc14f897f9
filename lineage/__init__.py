"""lineage: the dependency graph of a nosync run and the plans computed from it.

Pure logic with its own persistence: safe points, recovery plans and rewind plans. It imports
nothing of `nosync`.
"""
