"""Every judge, behind the protocol: the registry that turns ``--judge`` into a backend, the transport
policy and its senders (litellm, the OpenAI-compatible client, fleets), the scripted and embedded
judges, judges made of judges (cascade, vote), and the wrappers every judge stack has (cache, budget).
Only this package and rt4chart.signals talk to models."""
