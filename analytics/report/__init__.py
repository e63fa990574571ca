"""The offline capacity-planning report: gather figures from the SQL queries, then render
them as self-contained HTML, Markdown with PNG plots, and JSON.

Modules, one job each: `model` (the figures), `gather` (queries → figures), `advice`
(recommendation and findings), `plots` (matplotlib), `layout` (sections shared by both
renderers), `html`, `markdown`, `write` (files on disk).
"""
