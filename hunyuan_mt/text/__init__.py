"""Text on its way to and from the model, with no model in it: the language table (`languages`), each model
family's prompt card (`prompts`), do-not-translate spans (`masking`), sentences (`segment`), inline markup as the
model sees it (`inline`), prompts to token ids (`tokens`), target punctuation (`punctuation`), review marks
(`review`), a growing translation (`streaming`), glossaries (`glossary`) and language detection (`detect`).

May import `errors` and `host` only (`config` itself imports `prompts`); everything above may import it.
"""
