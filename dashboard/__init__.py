"""The prefixscope dashboard: Streamlit pages over `db` read-side queries and the engine's cache API.

`dashboard.cli` registers the `prefixscope dashboard` commands; `dashboard/app.py` is the Streamlit entry script and
`dashboard/views/` holds one script per page.
"""
