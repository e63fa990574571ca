"""Test helpers shared by the suite: engines, brokers, collectors, browsers, readback."""
