"""The facade every door calls (`translation.TranslationService`), its document jobs (`jobs`), the first request
of every kind before it says ready (`warmup`) and the background build of the fast step (`prebuild`).

May import every package below it; only the doors (`web`, `serve_ray`, `cli`, `app.py`) and `training`'s command
import it.
"""
