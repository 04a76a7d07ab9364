"""Examples of lltm doing real work. ``python -m lltm.examples.train``: LLTM
against nn.LSTM on scikit-learn's handwritten digits (see its docstring)."""
