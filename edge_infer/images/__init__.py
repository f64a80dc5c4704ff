"""Image inputs: reading an image a request names (`source.py`) and turning it into the pixel
tiles a projector's vision encoder takes, as llama.cpp's libmtmd prepares them (`preprocess.py`)."""
