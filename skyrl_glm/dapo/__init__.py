"""DAPO-math for GLM: answer extraction and reward env, dataset preparation, eval report."""
