"""Flow control that steers workers from what the store says (degradation
levels today); each part is a :class:`~corral.engine.hooks.Hooks`."""
