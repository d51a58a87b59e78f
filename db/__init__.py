"""The database: its tables and views, the store that writes them (a file or a lake), and the read path."""
