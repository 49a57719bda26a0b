"""The edges of corral: front-ends built on the public API only (the demo;
later the dashboard). Nothing in the engine or the stores imports from here."""
