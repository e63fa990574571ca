"""`kvscope collect`: consume -> decode -> columns -> write -> commit, exactly once."""
