"""Streamlit entry script: `streamlit run dashboard/app.py` (what `prefixscope dashboard` runs).

Each page is a script in `views/`; this file only sets the page up and picks the page.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

VIEWS = Path(__file__).resolve().parent / "views"
# A file shipped with the package, served by Streamlit itself: a Material icon as page icon would make the browser
# fetch the favicon from a font server on every page, which fails offline.
FAVICON = Path(__file__).resolve().parent / "assets" / "favicon.png"

st.set_page_config(page_title="prefixscope", page_icon=str(FAVICON), layout="wide")

pages = [
    st.Page(VIEWS / "overview.py", title="Overview", icon=":material/insights:", default=True),
    st.Page(VIEWS / "requests.py", title="Requests", icon=":material/receipt_long:", url_path="requests"),
    st.Page(VIEWS / "conversations.py", title="Conversations", icon=":material/forum:", url_path="conversations"),
    st.Page(VIEWS / "prefixes.py", title="Prefixes and rules", icon=":material/account_tree:", url_path="prefixes"),
    st.Page(VIEWS / "why_misses.py", title="Why misses", icon=":material/troubleshoot:", url_path="why-misses"),
    st.Page(VIEWS / "advice.py", title="Rule advice", icon=":material/lightbulb:", url_path="advice"),
    st.Page(VIEWS / "what_if.py", title="What-if", icon=":material/science:", url_path="what-if"),
    st.Page(VIEWS / "replicas.py", title="Replicas", icon=":material/hub:", url_path="replicas"),
    st.Page(VIEWS / "engine.py", title="Engine cache", icon=":material/memory:", url_path="engine"),
    st.Page(VIEWS / "cost.py", title="Cost", icon=":material/payments:", url_path="cost"),
]
st.navigation(pages).run()
