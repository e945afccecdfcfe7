# An excerpt: the definitions SGLang's findings read (Finding.code); 0.5.10.post1's file has none of should_skip_post_experts_all_reduce, post_experts_output_is_complete.
