"""What workers persist and how it is read back: their `lsm` stores, abs's checkpoint
manifests, the layout of a nosync worker's store and the input log of a source that cannot
restart from a position."""
