"""The RT4CHART method, one module per step: segment and chunk the context (text), decompose the
answer into claims (decompose), judge them against windows and the full context (verification),
anchor the evidence (grounding), join the labels (joins), and the steps beside the spine: citations,
the direct baseline, a calibrated threshold's settlement, claim repair. A step asks its judge only
through a session (session) with the requests of tasks (prompts rendered from prompts/). The method
knows judges only by the protocol (rt4chart.protocol), never by name."""
