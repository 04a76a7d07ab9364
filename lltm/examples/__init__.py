"""Examples of lltm doing real work, LLTM against nn.LSTM (see their docstrings):
``python -m lltm.examples.train`` on scikit-learn's handwritten digits (fixed
length), ``python -m lltm.examples.vowels`` on the Japanese vowels (7 to 29
steps, fed as a PackedSequence, ``--bidirectional``). ``lltm.examples.tsfile``
reads the ``.ts`` files the vowels come in. ``python -m lltm.examples.onnx_export``
exports a model of the training example's kind to ONNX and times it in ONNX
Runtime against eager PyTorch."""
