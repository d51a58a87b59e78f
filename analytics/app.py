"""Entry script of the dashboard (`flightrec dashboard` runs `streamlit run` on it); kept thin."""

from flightrec.analytics.navigation import main

if __name__ == "__main__":
    main()
