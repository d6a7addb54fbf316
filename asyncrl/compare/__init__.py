"""`asyncrl compare`: MLflow runs side by side (table.py: the pure comparison; fetch.py: reading MLflow;
report.py: PNG plots and the HTML page; command.py: the command line). Importing this package imports no MLflow."""
