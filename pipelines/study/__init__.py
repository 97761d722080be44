"""What a study is: the task (YAML), the label table matched to the inputs, and the cases (slides or patients)
the model sees."""
