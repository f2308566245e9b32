"""The machine the server runs on: torch's CPU threads (`cpu`), a backbone's memory read from its files before
loading (`footprint`), freed heap pages handed back (`heap`), helper processes that die with the server
(`helpers`), file locks that die with their holder (`locks`) and the folder for what is built once per machine
(`paths`).

Imports nothing of the project but `errors`: every other package may import it.
"""
