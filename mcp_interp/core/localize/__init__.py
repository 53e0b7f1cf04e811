"""Where does the information flow: patching of every component by layer × position, and loss."""
