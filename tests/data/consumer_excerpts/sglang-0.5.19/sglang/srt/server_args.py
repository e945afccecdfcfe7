# An excerpt: the definitions SGLang's findings read (Finding.code); 0.5.19's file has none of ServerArgs._handle_a2a_moe.
