"""Retention advice: which retention class each prefix should buy (`advice`), from a per-prefix replay of its uses
(`replay`) under a cost model per upstream kind (`costs`), with prices from `prefixscope.toml` (`prices`)."""
