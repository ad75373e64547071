"""FusionLens dashboard: a router over the pages in `pages/` (rendering only).

Run with `make run` (or `streamlit run app.py`); the server binds 127.0.0.1 by default
(.streamlit/config.toml). Pages share the loaded Trace through `st.session_state`.
"""
import streamlit as st

from pages.state import mark_router, resume_wanted_page



def main() -> None:
    st.set_page_config(page_title="FusionLens", page_icon="🔬", layout="wide")
    pages = [
        st.Page("pages/load.py", title="Load", icon="📂", default=True),
        st.Page("pages/profile.py", title="Profile a model", icon="🧪"),
    ]
    mark_router()
    page = st.navigation(pages)
    resume_wanted_page()
    page.run()


# Streamlit runs this file as __main__. A DDP capture's worker processes (multiprocessing spawn)
# import it again as __mp_main__: they must not run the dashboard.
if __name__ == "__main__":
    main()
