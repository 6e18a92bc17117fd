"""Judges made of judges: a cascade (a cheap judge settles what it is sure of) and a vote (the
majority of several). They sit above the transports, beside the method: they read the verify
step's payload and replies (:mod:`rt4chart.tasks`) and re-render narrowed requests, which no
transport in ``backends/`` does."""
