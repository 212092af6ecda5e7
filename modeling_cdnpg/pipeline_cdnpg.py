"""`pipeline("text2text-generation", model=..., trust_remote_code=True)` for C-DNPG checkpoints.

transformers 5.x removed the built-in text2text-generation pipeline; a checkpoint that declares this class under
`custom_pipelines` in its config keeps the task name working on 5.x and 4.57.x alike. Copied into every saved
checkpoint (remote code), so it imports only torch and transformers.
"""

import torch
from transformers import Pipeline


class CDNPGText2TextPipeline(Pipeline):
    """Paraphrases a string or a list of strings: `[{"generated_text": ...}]` per input, one dict per returned sequence.

    Generation keyword arguments (num_beams, num_return_sequences, max_new_tokens, do_sample, ...) are passed through
    to `model.generate()`; unset ones come from the checkpoint's generation_config (beam 8, 20 new tokens).
    """

    _pipeline_calls_generate = True  # 5.x: lets the pipeline own a generation config; ignored by 4.57

    def _sanitize_parameters(
        self, truncation: bool | None = None, clean_up_tokenization_spaces=None, **generate_kwargs
    ):
        preprocess_params = {} if truncation is None else {"truncation": truncation}
        postprocess_params = {}
        if clean_up_tokenization_spaces is not None:
            postprocess_params["clean_up_tokenization_spaces"] = clean_up_tokenization_spaces
        return preprocess_params, generate_kwargs, postprocess_params

    def preprocess(self, text: str, truncation: bool = True) -> dict[str, torch.Tensor]:
        if not isinstance(text, str):
            raise TypeError(f"text2text-generation takes a string or a list of strings, got {type(text).__name__}")
        inputs = self.tokenizer(text, return_tensors="pt", truncation=truncation)
        return {"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"]}

    def _forward(self, model_inputs: dict[str, torch.Tensor], **generate_kwargs) -> dict[str, torch.Tensor]:
        batch_size = model_inputs["input_ids"].shape[0]
        output_ids = self.model.generate(**model_inputs, **generate_kwargs)
        return {"output_ids": output_ids.reshape(batch_size, output_ids.shape[0] // batch_size, -1)}

    def postprocess(self, model_outputs: dict[str, torch.Tensor], clean_up_tokenization_spaces: bool = True):
        return [
            {
                "generated_text": self.tokenizer.decode(
                    ids, skip_special_tokens=True, clean_up_tokenization_spaces=clean_up_tokenization_spaces
                )
            }
            for ids in model_outputs["output_ids"][0]
        ]


__all__ = ["CDNPGText2TextPipeline"]
