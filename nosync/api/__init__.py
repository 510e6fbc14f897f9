"""The pipeline API: a pipeline and its streams, sources and sinks, the loader of pipeline files
and the planner that turns a pipeline into W instances of every operator."""
