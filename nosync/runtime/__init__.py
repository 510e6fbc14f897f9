"""The runtime on a worker: the loop, its operators, the router and channels between workers,
the frames on the wire, and the hooks through which a mode joins the loop."""
